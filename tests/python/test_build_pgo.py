"""The profile-guided build (cmake/pgo.cmake) and its switches in
scripts/bootstrap.sh: each bad value is refused with the valid ones, each step
gives its target the compiler options it needs, and a small program goes
through all three steps (instrument, run, rebuild with its profile). The
training workload of scripts/pgo_build.sh runs on flagos."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def _is_gcc() -> bool:
    """GCC 10 or later, as cmake/pgo.cmake requires."""
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    if "__clang__" in out:
        return False
    major = [line.split()[2] for line in out.splitlines() if line.startswith("#define __GNUC__ ")]
    return bool(major) and int(major[0]) >= 10


needs_gcc = pytest.mark.skipif(shutil.which("cmake") is None or not _is_gcc(),
                               reason="the profile-guided build needs cmake and GCC 10 or later")


PROBE = """
#include <cstdlib>
int flagos_pgo_probe(int a) { return a > 0 ? a : -a; }
int main(int argc, char**) { int s = 0; for (int i = 0; i < 1000; ++i) s += flagos_pgo_probe(i - argc); return s == 0; }
"""


def configure(tmp_path, *defines):
    """Configures a one-program project that applies cmake/pgo.cmake; returns (rc, output, build dir)."""
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir(exist_ok=True)
    (src / "x.cpp").write_text(PROBE)
    (src / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.22)
        project(pgo_probe CXX)
        option(FLAGOS_SANITIZE "" OFF)
        include({ROOT}/cmake/pgo.cmake)
        add_executable(probe x.cpp)
        flagos_apply_pgo(probe)
        """))
    p = subprocess.run(["cmake", "-S", str(src), "-B", str(build), *[f"-D{d}" for d in defines]],
                       capture_output=True, text=True)
    # CMake wraps long messages: compare them with their whitespace collapsed.
    return p.returncode, " ".join((p.stdout + p.stderr).split()), build


def compile_commands(build) -> str:
    subprocess.run(["cmake", str(build), "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"], check=True,
                   capture_output=True)
    return (build / "compile_commands.json").read_text()


@needs_cmake
def test_bad_value_names_the_valid_ones(tmp_path):
    rc, out, _ = configure(tmp_path, "FLAGOS_PGO=yes")
    assert rc != 0
    assert "FLAGOS_PGO='yes'" in out and "generate, use, or empty" in out


@needs_cmake
def test_off_by_default_adds_nothing(tmp_path):
    rc, out, build = configure(tmp_path)
    assert rc == 0, out
    assert "-fprofile" not in compile_commands(build)


@needs_gcc
def test_generate_instruments_into_the_profile_directory(tmp_path):
    profile = tmp_path / "profile"
    rc, out, build = configure(tmp_path, "FLAGOS_PGO=generate", f"FLAGOS_PGO_DIR={profile}")
    assert rc == 0, out
    assert f"-fprofile-generate={profile}" in compile_commands(build)


@needs_gcc
def test_use_without_a_profile_says_how_to_make_one(tmp_path):
    profile = tmp_path / "empty"
    profile.mkdir()
    rc, out, _ = configure(tmp_path, "FLAGOS_PGO=use", f"FLAGOS_PGO_DIR={profile}")
    assert rc != 0
    assert "holds no profile" in out and "FLAGOS_PGO=generate" in out


@needs_gcc
def test_three_steps_build_with_the_programs_own_profile(tmp_path):
    profile = tmp_path / "profile"
    rc, out, build = configure(tmp_path, "FLAGOS_PGO=generate", f"FLAGOS_PGO_DIR={profile}")
    assert rc == 0, out
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    subprocess.run([str(build / "probe")], capture_output=True)  # exits 0: its result is not the point
    assert list(profile.rglob("*.gcda")), "the instrumented program wrote no profile"
    rc, out, build = configure(tmp_path, "FLAGOS_PGO=use")
    assert rc == 0, out
    assert f"-fprofile-use={profile}" in compile_commands(build)
    p = subprocess.run(["cmake", "--build", str(build), "--clean-first"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # GCC warns for each object whose profile it cannot find (a build tree moved, a path changed).
    assert "missing-profile" not in p.stdout + p.stderr


@needs_gcc
def test_use_refuses_a_profile_of_another_build_tree(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "#elsewhere#CMakeFiles#probe.dir#x.cpp.gcda").write_bytes(b"")
    rc, out, _ = configure(tmp_path, "FLAGOS_PGO=use", f"FLAGOS_PGO_DIR={profile}")
    assert rc != 0
    assert "holds no profile" in out


@needs_gcc
def test_sanitizers_and_profile_are_refused_together(tmp_path):
    rc, out, _ = configure(tmp_path, "FLAGOS_PGO=generate", "FLAGOS_SANITIZE=ON")
    assert rc != 0 and "choose one" in out


@pytest.mark.parametrize("var", ["FLAGOS_PGO", "FLAGOS_REBUILD"])
def test_bootstrap_refuses_a_bad_switch_before_doing_anything(tmp_path, var):
    venv = tmp_path / "venv"
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "bootstrap.sh")],
                       env={**os.environ, var: "yes", "FLAGOS_VENV": str(venv)},
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert f"{var}='yes'" in p.stderr and "0 (the default) and 1" in p.stderr
    assert not venv.exists()


def test_the_training_workload_runs_on_flagos(tmp_path):
    conf = tmp_path / "native.conf"
    conf.write_text("* = native\n")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "pgo_workload.py"),
                        "--steps", "2", "--tokens", "4"],
                       env={**os.environ, "FLAGOS_BACKEND_CONFIG": str(conf)},
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pgo workload on" in p.stdout

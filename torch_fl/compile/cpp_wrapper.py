"""Inductor's C++ wrapper (``cpp_wrapper=True``) and AOTInductor for flagos graphs.

The C++ wrapper is Inductor's own (CPU's on the host driver, CUDA's on the
cuda driver: the kernels are the native device's, docs/compile.md), with three
flagos pieces:

- operators Inductor leaves to ATen call ``aoti_torch_flagos_<op>``, C shims
  generated at build time from this torch's torchgen (csrc/inductor/
  gen_c_shim.py) that call the operator through the dispatcher, so routing
  decides the kernel as in eager mode. They live in libtorch_fl_aoti.so,
  which the wrappers Inductor compiles for flagos link against;
- buffers are allocated as PrivateUse1 (flagos) tensors;
- an AOTInductor model is built as its native device's model, which is all
  AOTInductor's model base accepts, and relabelled flagos in its constructor
  (flagos_aoti.h), so its weights and outputs are flagos tensors. The package
  records device "flagos"; ``aoti_load_package`` finds the runner
  libtorch_fl_aoti.so registers under that name.
"""

import ctypes
import functools
import hashlib
import os
import re
import threading
import warnings

from .._wrap import wrap_once
from ..flagos._device import _on_cuda

_lock = threading.RLock()
_library = None
_registered = False
_unavailable = None  # why the C++ wrapper cannot run on flagos in this process, or None

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY_PATH = os.path.join(_PACKAGE_DIR, "lib", "libtorch_fl_aoti.so")
HEADER_PATH = os.path.join(_PACKAGE_DIR, "include", "flagos_aoti.h")


def load_library() -> None:
    """Loads libtorch_fl_aoti.so once: it registers the AOTInductor runner for flagos.

    Loaded with local symbols: the compiled wrappers find the shims by linking
    against the library, and nothing of it, or of the torch libraries it
    depends on, enters the process's global symbol scope.
    """
    global _library
    with _lock:
        if _library is None:
            if not os.path.exists(LIBRARY_PATH):
                raise RuntimeError(
                    f"torch_fl: {LIBRARY_PATH} is missing, so Inductor's C++ wrapper and AOTInductor "
                    "cannot run on flagos; rebuild torch_fl (pip install . or scripts/dev_build.sh)"
                )
            _library = ctypes.CDLL(LIBRARY_PATH, mode=os.RTLD_LOCAL | os.RTLD_NOW)


def _register_device_names() -> None:
    # How the C++ wrapper spells the flagos device: at::kPrivateUse1, and its
    # DeviceType number for the input checks of an AOTInductor model.
    from torch._inductor.codegen import cpp_utils

    cpp_utils.DEVICE_TO_ATEN["flagos"] = "at::kPrivateUse1"
    cpp_utils.DEVICE_TO_INT["flagos"] = _library.aoti_torch_device_type_privateuse1()


@functools.cache
def _headers_digest() -> str:
    digest = hashlib.sha256()
    for name in ("flagos_aoti.h", "c_shim_flagos.h"):
        with open(os.path.join(os.path.dirname(HEADER_PATH), name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


_BASE_INIT = re.compile(r"^(\s*)device_str,\s*$")


def check_available() -> None:
    """Raises, naming the cause, when Inductor's C++ wrapper cannot run on flagos."""
    if _unavailable is not None:
        raise RuntimeError(
            "torch_fl: Inductor's C++ wrapper (cpp_wrapper=True, AOTInductor) cannot run on flagos "
            f"in this process: {_unavailable}. The Python wrapper (the default) is unaffected."
        )


class FlagosCppWrapperMixin:
    """What a flagos C++ wrapper adds to the native device's (``native_type``)."""

    native_type = "cpu"

    def __init__(self):
        check_available()
        super().__init__()  # the native device's code generation
        self.device = "flagos"

    @classmethod
    def create(cls, is_subgraph, subgraph_name=None, parent_wrapper=None, partition_signatures=None):
        return cls()

    @classmethod
    def _include(cls, method: str, device: str) -> str:
        # flagos code needs the native device's header; write_header adds flagos_aoti.h.
        return getattr(super(), method)(cls.native_type if device == "flagos" else device)

    @classmethod
    def get_device_include_path(cls, device):  # torch 2.11's name for the two below
        return cls._include("get_device_include_path", device)

    @classmethod
    def get_device_include_path_jit(cls, device):
        return cls._include("get_device_include_path_jit", device)

    @classmethod
    def get_device_include_path_aot(cls, device):
        return cls._include("get_device_include_path_aot", device)

    def write_header(self):
        # Some torch versions name the header of the wrapper's own device
        # (self.device) directly: that must be the native device's.
        self.device = self.native_type
        try:
            super().write_header()
        finally:
            self.device = "flagos"
        from torch._inductor.virtualized import V

        if not V.graph.is_const_graph:
            # The digest enters Inductor's cache keys (the source text): code
            # compiled against other flagos headers is never reused.
            self.header.splice(f'#include "{HEADER_PATH}"  // flagos headers {_headers_digest()}')

    def codegen_model_constructor(self):
        super().codegen_model_constructor()
        # The model base takes the native device's name; the body relabels
        # the model flagos before its weights are loaded (they are loaded by
        # the container, after construction).
        lines = self.prefix._lines
        start = _find_line(lines, 0, lambda line: ": AOTInductorModelBase(" in line)
        base = None if start is None else _find_line(lines, start, _BASE_INIT.match)
        body = None if base is None else _find_line(lines, base, lambda line: line.rstrip().endswith(") {"))
        if body is None:
            raise RuntimeError(
                "torch_fl: this torch's AOTInductor model constructor is not the one flagos knows "
                "(torch/_inductor/codegen/cpp_wrapper_cpu.py codegen_model_constructor); "
                "AOTInductor cannot build flagos models with it"
            )
        indent = _BASE_INIT.match(lines[base]).group(1)
        lines[base] = f'{indent}torch_fl::aoti::native_device_str(device_str, "{self.native_type}"),'
        lines.insert(body + 1, "    device_type_ = aoti_torch_device_type_privateuse1();")
        lines.insert(body + 2, "    device_idx_ = torch_fl::aoti::device_index(device_str);")


def _find_line(lines, start: int, matches):
    """The index of the first code line from `start` that `matches`, or None."""
    return next((i for i in range(start, len(lines)) if isinstance(lines[i], str) and matches(lines[i])), None)


def host_wrapper():
    """The C++ wrapper class for the host driver: CPU's, for flagos."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    class FlagosHostCppWrapper(FlagosCppWrapperMixin, CppWrapperCpu):
        native_type = "cpu"

    return FlagosHostCppWrapper


def _build_as_native(native_type: str) -> None:
    # Inductor builds a graph's C++ with the options and precompiled header of
    # its device type; flagos code is the native device's code (plus
    # flagos_aoti.h, which the wrapper includes by path).
    from torch._inductor import codecache, cpp_builder

    # Names that older or newer torch may lack are checked up front, so that
    # a torch this code does not know fails here, with its name.
    for module, name in ((cpp_builder, "get_cpp_torch_device_options"),
                         (codecache, "_get_cpp_wrapper_header"),
                         (codecache, "_get_cpp_prefix_header")):
        if not callable(getattr(module, name, None)):
            raise RuntimeError(f"this torch has no {module.__name__}.{name}")

    def is_flagos(device_type) -> bool:
        return isinstance(device_type, str) and device_type.split(":", 1)[0] == "flagos"

    def as_native(original):
        def wrapper(device, *args, **kwargs):
            return original(native_type if is_flagos(device) else device, *args, **kwargs)

        return wrapper

    library_dir = os.path.dirname(LIBRARY_PATH)
    runtime = _cxx_runtime()

    def linking_the_shims(original):
        def get_cpp_torch_device_options(device_type, *args, **kwargs):
            if not is_flagos(device_type):
                return original(device_type, *args, **kwargs)
            # flagos code links the shims' library, found again at load by its
            # rpath. Link options only: Inductor drops them from steps that do
            # not link (compile only, precompiled headers).
            (definitions, include_dirs, cflags, ldflags, library_dirs, libraries,
             passthrough) = original(native_type, *args, **kwargs)
            ldflags = [*ldflags, f"Wl,-rpath,{library_dir}"]  # Inductor adds the leading "-"
            if runtime is not None:
                ldflags.append(f"Wl,{runtime}")
            library_dirs = [*library_dirs, library_dir]
            libraries = [*libraries, "torch_fl_aoti"]
            return definitions, include_dirs, cflags, ldflags, library_dirs, libraries, passthrough

        return get_cpp_torch_device_options

    wrap_once(cpp_builder, "get_cpp_torch_device_options", linking_the_shims)
    wrap_once(codecache, "_get_cpp_wrapper_header", as_native)
    wrap_once(codecache, "_get_cpp_prefix_header", as_native)


def _cxx_runtime():
    """The C++ standard library this process runs on (its path), or None if not found.

    Code Inductor compiles for flagos links it by path, ahead of the
    compiler's own. A compiler whose libstdc++ is a static archive only (the
    GCC under /opt/gcc on the GPU machines) otherwise gives the library a
    private, exported copy of the standard library, which mixes with the
    process's: AOTInductor's model constructor then crashes in std::regex
    (native CUDA packages built by that compiler crash the same way,
    docs/compile.md).
    """
    try:
        with open("/proc/self/maps") as maps:
            # address perms offset dev inode path: the path may hold spaces.
            paths = {fields[5].removesuffix(" (deleted)")
                     for fields in (line.rstrip("\n").split(maxsplit=5) for line in maps)
                     if len(fields) == 6 and "/libstdc++.so" in fields[5]}
    except OSError:
        return None
    paths = {p for p in paths if os.path.exists(p) and "," not in p}  # "," would split -Wl,
    if len(paths) > 1:
        warnings.warn(f"torch_fl: several C++ runtimes are loaded ({', '.join(sorted(paths))}); "
                      "code compiled for flagos links the compiler's own")
    return paths.pop() if len(paths) == 1 else None


def cuda_wrapper():
    """The C++ wrapper class for the cuda driver: CUDA's (Triton kernels), for flagos."""
    from torch._inductor.codegen.cpp_wrapper_gpu import CppWrapperGpu

    class FlagosCudaCppWrapper(FlagosCppWrapperMixin, CppWrapperGpu):
        native_type = "cuda"

    return FlagosCudaCppWrapper


def register() -> None:
    """Loads the shims and teaches Inductor's C++ build the flagos device (once)."""
    global _registered, _unavailable
    with _lock:
        if _registered:
            return
        _registered = True
        # A failure here must not take the Python wrapper (torch.compile's
        # default) down with it: it is reported when the C++ wrapper is used.
        try:
            load_library()
            _register_device_names()
            _build_as_native("cuda" if _on_cuda() else "cpu")
        except Exception as error:  # noqa: BLE001  (any cause, reported later)
            _unavailable = f"{type(error).__name__}: {error}"

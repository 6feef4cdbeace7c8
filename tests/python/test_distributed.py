"""torch.distributed on flagos: the ``flagos`` c10d backend (docs/distributed.md).

Every check runs in real multi-process jobs, one process per rank, each rank on
its own flagos device (tests/python/distributed_worker.py says what each check
compares). On the host driver the jobs run with 2 and 4 ranks; all of them
start together the first time a test asks for one, so the module costs about
as long as its slowest job. The `multigpu` tests run the same checks with 2
ranks on the cuda driver (NCCL).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

import torch_fl

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_worker.py")
JOB_TIMEOUT_S = 240
# Devices are used only by the jobs' processes (conftest._uses_second_device).
USES_DEVICES_IN_CHILDREN_ONLY = True

# Set in every process of a GPU job: the 2-GPU machines must not use NVLink
# multicast (NVLS), which they do not support.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}

REDUCE_OPS = [
    "SUM_float32", "SUM_int64", "AVG_float32", "PRODUCT_float32", "PRODUCT_int64",
    "MIN_float32", "MIN_int64", "MAX_float32", "MAX_int64", "BAND_int64", "BOR_int64",
    "BXOR_int64", "PREMUL_SUM_float", "PREMUL_SUM_tensor",
]
COLLECTIVES = [
    "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send_recv", "scatter_gather",
    "barrier", "coalesced", "async_work_and_future", "async_orders_the_current_stream",
    "cpu_tensors_in_same_group", "sparse_all_reduce", "subgroups",
]
BAD_INPUT = [
    "cpu_tensor_to_flagos_backend", "cpu_input_with_flagos_output",
    "tensors_on_two_flagos_devices", "all_gather_list_of_wrong_world_size",
    "all_gather_into_tensor_wrong_size", "reduce_scatter_tensor_wrong_size",
    "output_of_another_dtype", "sparse_broadcast_refused", "sparse_all_reduce_max",
    "all_to_all_wrong_world_size",
    "group_usable_after_errors",
]


def _env(extra):
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # children run elsewhere: keep PYTHONPATH=. pointed here
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env.pop("FLAGOS_HOST_DEVICES", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Job:
    """One distributed job: `world` worker processes, or torchrun starting them."""

    def __init__(self, job, world, env, torchrun=False):
        self.job, self.world = job, world
        self.out = tempfile.mkdtemp(prefix=f"flagos_dist_{job}_")
        self.procs, self._results = [], None
        if torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={world}", WORKER, job, self.out]
            self._start(cmd, env, "torchrun")
            return
        for rank in range(world):
            self._start([sys.executable, WORKER, job, self.out],
                        {**env, "RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank},
                        f"rank{rank}")

    def _start(self, cmd, env, name):
        log = open(os.path.join(self.out, f"{name}.log"), "w")
        self.procs.append(subprocess.Popen(cmd, env=_env(env), stdout=log,
                                           stderr=subprocess.STDOUT, cwd=self.out))

    def logs(self):
        text = []
        for name in sorted(os.listdir(self.out)):
            if name.endswith(".log"):
                with open(os.path.join(self.out, name)) as f:
                    text.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(text)

    def results(self):
        """Waits for the job; returns each rank's {check: outcome}."""
        if self._results is None:
            deadline = time.monotonic() + JOB_TIMEOUT_S
            for p in self.procs:
                try:
                    p.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    for q in self.procs:
                        q.kill()
                    raise AssertionError(f"job {self.job} hung\n{self.logs()}") from None
            self._results = []
            for rank in range(self.world):
                path = os.path.join(self.out, f"{self.job}.rank{rank}.json")
                # a rank that died (on purpose, in killed_peer) reports nothing
                if os.path.exists(path):
                    with open(path) as f:
                        self._results.append(json.load(f))
                else:
                    self._results.append({})
            shutil.rmtree(os.path.join(self.out, "ckpt"), ignore_errors=True)
        return self._results

    def check(self, name, ranks=None):
        results = self.results()
        for rank in ranks if ranks is not None else range(self.world):
            outcome = results[rank].get(name)
            assert outcome is not None, (
                f"{self.job}: rank {rank} did not report {name}\n{self.logs()}")
            assert outcome == "ok", f"{self.job} rank {rank}, {name}:\n{outcome}"


def host(devices, timeout=60, backend=""):
    return {"FLAGOS_ACCELERATOR": "host", "FLAGOS_HOST_DEVICES": devices,
            "DIST_TEST_TIMEOUT": timeout, "DIST_TEST_BACKEND": backend}


@pytest.fixture(scope="module")
def jobs():
    """Every host-driver job, started at once (2 cores: imports dominate)."""
    started = {
        # the three ways to ask for the backend: bare, by name, by device map
        ("main", 2): Job("main", 2, host(2)),
        ("main", 4): Job("main", 4, host(4, backend="cpu:gloo,flagos:flagos")),
        "torchrun": Job("torchrun", 2, host(2), torchrun=True),
        "killed_peer": Job("killed_peer", 2, host(2, timeout=30, backend="flagos")),
        "gloo": Job("gloo", 2, host(2, backend="gloo")),
        # one flagos device, two processes: a CPU-only program
        "cpu_only": Job("cpu_only", 2, host(1), torchrun=True),
        "timeout": Job("timeout", 2, host(2, timeout=3)),
        "wrong_world_size": Job("wrong_world_size", 2, host(2, timeout=3)),
    }
    yield started
    for job in started.values():
        for p in job.procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(job.out, ignore_errors=True)


# ---- registration (this process) ----------------------------------------------------


def test_backend_is_registered_for_flagos():
    assert "flagos" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["flagos"] == "flagos"
    assert dist.get_default_backend_for_device("flagos") == "flagos"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # untouched
    assert set(dist.Backend.backend_capability["flagos"]) == {"flagos", "cpu"}
    assert torch_fl.distributed.is_available()


# ---- the host driver, 2 and 4 ranks -----------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_all_reduce(jobs, world, op):
    jobs[("main", world)].check(f"all_reduce_{op}")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective(jobs, world, name):
    jobs[("main", world)].check(name)


@pytest.mark.parametrize("world, backend", [(2, "undefined"), (4, "cpu:gloo,flagos:flagos")])
def test_group_is_gloo_for_cpu_and_flagos_over_gloo_for_flagos(jobs, world, backend):
    """A bare init_process_group() (2 ranks) and "cpu:gloo,flagos:flagos" (4)
    give the same group; "flagos" by name is the killed_peer job's."""
    job = jobs[("main", world)]
    job.check("group_backends")
    assert job.results()[0]["backend"] == backend


@pytest.mark.parametrize("name", ["group_backends", "all_reduce_SUM_float32", "cpu_tensors_in_same_group",
                                  "fsdp2_default_mesh"])
def test_gloo_by_name_gives_flagos_tensors_the_flagos_backend(jobs, name):
    """init_process_group("gloo"): PyTorch maps gloo to cpu and cuda only; flagos
    tensors take the flagos backend (gloo inside), and FSDP2's default mesh works."""
    jobs["gloo"].check(name)
    assert jobs["gloo"].results()[0]["backend"] == "gloo"


def test_device_mesh_2d(jobs):
    jobs[("main", 4)].check("mesh_2d")


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_matches_single_process_training(jobs, world):
    jobs[("main", world)].check("ddp")


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_with_a_sparse_embedding_matches_single_process_training(jobs, world):
    jobs[("main", world)].check("ddp_sparse_embedding")


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor_random_operators_match_a_cpu_mesh(jobs, world):
    jobs[("main", world)].check("dtensor_random")


@pytest.mark.parametrize("world", [2, 4])
def test_sync_batch_norm_matches_batch_norm_over_the_whole_batch(jobs, world):
    jobs[("main", world)].check("sync_batch_norm")


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_matches_single_process_training_and_checkpoint_round_trips(jobs, world):
    jobs[("main", world)].check("fsdp2_and_checkpoint")


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor(jobs, world):
    jobs[("main", world)].check("dtensor")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", BAD_INPUT)
def test_bad_input_fails_clearly(jobs, world, name):
    jobs[("main", world)].check(name)


# ---- torchrun, and FSDP2 on CPU tensors with torch_fl loaded -----------------------------


def test_torchrun_bare_device_mesh_on_cpu_with_torch_fl_loaded(jobs):
    jobs["torchrun"].check("cpu_fsdp2_with_torch_fl_loaded")


def test_torchrun_local_rank_is_the_flagos_device(jobs):
    jobs["torchrun"].check("local_rank_is_the_flagos_device")


@pytest.mark.parametrize("backend", ["gloo", "bare"])
def test_torchrun_cpu_only_program_with_more_processes_than_flagos_devices(jobs, backend):
    """LOCAL_RANK 1 with one flagos device: a CPU program's group must not be
    refused for flagos' sake, and "gloo" must not initialise flagos."""
    jobs["cpu_only"].check(f"cpu_all_reduce_{backend}")


def test_torchrun_fsdp2_default_mesh_is_flagos(jobs):
    jobs["torchrun"].check("fsdp2_default_mesh_is_flagos")


# ---- faults: raise, never hang --------------------------------------------------------


def test_killed_peer_raises(jobs):
    job = jobs["killed_peer"]
    job.check("killed_peer_raises", ranks=[0])
    assert job.results()[0]["killed_peer_seconds"] < 30


def test_timeout_raises_after_the_timeout(jobs):
    job = jobs["timeout"]
    job.check("timeout_raises", ranks=[0])
    seconds = job.results()[0]["timeout_seconds"]
    assert 2.0 <= seconds < 3 + 20, seconds


def test_wrong_world_size_raises_after_the_timeout(jobs):
    job = jobs["wrong_world_size"]
    job.check("wrong_world_size_raises")
    for r in job.results():
        assert r["wrong_world_size_seconds"] < 3 + 20, r


# ---- the cuda driver: 2 GPUs, NCCL ----------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_job():
    if torch_fl.driver() != "cuda" or torch.flagos.device_count() < 2:
        pytest.skip("needs the cuda driver and 2 GPUs")
    job = Job("main", 2, {"FLAGOS_ACCELERATOR": "cuda", "DIST_TEST_TIMEOUT": 120, **GPU_ENV})
    yield job
    shutil.rmtree(job.out, ignore_errors=True)


GPU_CHECKS = (
    ["group_backends"]
    + [f"all_reduce_{op}" for op in REDUCE_OPS if not op.startswith("B")]
    + COLLECTIVES + ["ddp", "sync_batch_norm", "fsdp2_and_checkpoint", "dtensor"] + BAD_INPUT
)


@pytest.mark.cuda
@pytest.mark.multigpu
@pytest.mark.parametrize("name", GPU_CHECKS)
def test_gpu(gpu_job, name):
    gpu_job.check(name)


def test_checkpoint_writer_copies_flagos_tensors_when_another_device_type_is_first(monkeypatch):
    # DCP's overlapping loader copies to the CPU only tensors of the first
    # available device type: "cuda" on the cuda driver. Simulated here with a
    # stand-in CUDA module; flagos tensors must still reach the writer on the CPU.
    import contextlib
    import types

    import torch.distributed.checkpoint.filesystem as filesystem

    class Stream:
        def synchronize(self):
            pass

    stream = Stream()
    cuda = types.SimpleNamespace(current_stream=lambda: stream,
                                 stream=lambda s: contextlib.nullcontext())
    monkeypatch.setattr(filesystem, "_get_available_device_type", lambda: "cuda")
    monkeypatch.setattr(filesystem, "_get_device_module", lambda device_type: cuda)
    g = torch.Generator().manual_seed(7)
    tensors = [torch.randn(3, generator=g).to("flagos"), torch.randn(2, 5, generator=g).to("flagos")[:, 1:4]]
    loader = filesystem._OverlappingCpuLoader(lambda i: tensors[i])
    assert loader.device_type == "cuda"
    for i, t in enumerate(tensors):
        loader.add(t.numel() * t.element_size(), i)
    loader.start_loading()
    got = {i: t for t, i in loader.values()}
    for i, t in enumerate(tensors):
        assert got[i].device.type == "cpu" and torch.equal(got[i], t.cpu())

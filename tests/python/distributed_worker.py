"""One rank of a torch.distributed job for tests/python/test_distributed.py.

    python distributed_worker.py JOB OUT_DIR

Rank and world size come from the environment (RANK, WORLD_SIZE; torchrun sets
them too). Every job runs a list of checks in the same order on every rank and
writes ``OUT_DIR/<job>.rank<R>.json``: ``{check: "ok" | error text}``. A check
compares with exact expected values computed on the CPU from every rank's
(deterministic) inputs, so each rank can verify the whole result.

Jobs: ``main`` (every collective, subgroups and a 2-D mesh, DDP, FSDP2,
DTensor, checkpoint, bad input), ``torchrun`` (started by torchrun), and the
faults ``killed_peer``, ``timeout``, ``wrong_world_size``.
"""

import datetime
import functools
import json
import operator
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import torch_fl  # noqa: F401  (registers the flagos device and its c10d backend)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
JOB, OUT = sys.argv[1], sys.argv[2]
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "60")))
DEVICE = None  # the flagos device of this rank, set in main()
CUDA = torch_fl.driver() == "cuda"  # NCCL inside the flagos backend, not gloo
R = dist.ReduceOp

results = {}


def record(name, fn):
    try:
        fn()
        results[name] = "ok"
    except Exception:  # noqa: BLE001  (every failure is reported by name)
        results[name] = traceback.format_exc(limit=6)


def init():
    # DIST_TEST_BACKEND: none (a bare init_process_group()), "flagos",
    # "cpu:gloo,flagos:flagos" or "gloo"; every form must give the same group.
    backend = os.environ.get("DIST_TEST_BACKEND") or None
    dist.init_process_group(
        backend,
        init_method=f"file://{OUT}/store",
        rank=RANK,
        world_size=WORLD,
        timeout=TIMEOUT,
    )


# ---- inputs and expected values -------------------------------------------------


def data(rank, n=6, dtype=torch.float32):
    """Rank `rank`'s input: small integers, exact in every dtype used."""
    return ((torch.arange(n) % 3) + 1 + 2 * rank).to(dtype)


def all_data(n=6, dtype=torch.float32):
    return [data(r, n, dtype) for r in range(WORLD)]


def on(t):
    return t.to(DEVICE)


def same(actual, expected, what):
    if actual.device != DEVICE:
        raise AssertionError(f"{what}: result on {actual.device}, expected {DEVICE}")
    got = actual.cpu()
    if got.dtype != expected.dtype or got.shape != expected.shape or not torch.equal(got, expected):
        raise AssertionError(f"{what}: got {got.tolist()} ({got.dtype}), expected "
                             f"{expected.tolist()} ({expected.dtype})")


def expect_error(fn, *fragments, kind=Exception):
    """Runs fn; it must raise `kind`, with every fragment in the message."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        if not isinstance(e, kind):
            raise AssertionError(f"raised {type(e).__name__}, not {kind.__name__}: {e}") from None
        msg = str(e)
        missing = [f for f in fragments if f not in msg]
        if missing:
            raise AssertionError(f"error lacks {missing}: {msg}") from None
        return msg
    raise AssertionError("no error raised")


def timed_error(key, fn, *fragments):
    """expect_error(fn, *fragments), recording how long the error took to come
    (`key`_seconds) and its message (`key`_message)."""
    start = time.monotonic()
    msg = expect_error(fn, *fragments)
    results[f"{key}_seconds"] = time.monotonic() - start
    results[f"{key}_message"] = msg[:300]


# ---- collectives --------------------------------------------------------------

REDUCTIONS = {
    "SUM": (R.SUM, lambda xs: functools.reduce(operator.add, xs)),
    "AVG": (R.AVG, lambda xs: functools.reduce(operator.add, xs) / WORLD),
    "PRODUCT": (R.PRODUCT, lambda xs: functools.reduce(operator.mul, xs)),
    "MIN": (R.MIN, lambda xs: functools.reduce(torch.minimum, xs)),
    "MAX": (R.MAX, lambda xs: functools.reduce(torch.maximum, xs)),
    "BAND": (R.BAND, lambda xs: functools.reduce(operator.and_, xs)),
    "BOR": (R.BOR, lambda xs: functools.reduce(operator.or_, xs)),
    "BXOR": (R.BXOR, lambda xs: functools.reduce(operator.xor, xs)),
}


def reduction_cases():
    for name, (op, ref) in REDUCTIONS.items():
        if name.startswith("B") and torch_fl.driver() == "cuda":
            continue  # NCCL has no bitwise reductions
        dtypes = [torch.int64] if name.startswith("B") else [torch.float32, torch.int64]
        if name == "AVG":
            dtypes = [torch.float32]
        for dtype in dtypes:
            yield f"all_reduce_{name}_{str(dtype)[6:]}", op, ref, dtype


def check_all_reduce(op, ref, dtype):
    t = on(data(RANK, dtype=dtype))
    assert dist.all_reduce(t, op=op) is None
    same(t, ref(all_data(dtype=dtype)), "all_reduce")


def check_premul_sum(kind):
    scale = 0.5 if kind == "float" else 0.25
    factor = scale if kind == "float" else on(torch.tensor(scale))
    t = on(data(RANK))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
    same(t, sum(all_data()) * scale, "all_reduce PREMUL_SUM")
    # reduce_scatter_tensor with PREMUL_SUM leaves its input unchanged
    inp = on(torch.cat(all_data(2)) + RANK)
    before = inp.cpu()
    out = on(torch.empty(2))
    dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(factor))
    expected = sum(torch.cat(all_data(2)) + r for r in range(WORLD)) * scale
    same(out, expected[2 * RANK:2 * RANK + 2], "reduce_scatter_tensor PREMUL_SUM")
    same(inp, before, "reduce_scatter_tensor PREMUL_SUM input")


def check_broadcast():
    for src in range(WORLD):
        t = on(data(RANK))
        dist.broadcast(t, src=src)
        same(t, data(src), f"broadcast from {src}")


def check_reduce():
    dst = WORLD - 1
    t = on(data(RANK))
    dist.reduce(t, dst=dst, op=R.MAX)
    if RANK == dst:
        same(t, functools.reduce(torch.maximum, all_data()), "reduce")


def check_all_gather():
    outs = [on(torch.empty(6)) for _ in range(WORLD)]
    dist.all_gather(outs, on(data(RANK)))
    for r, o in enumerate(outs):
        same(o, data(r), f"all_gather[{r}]")


def check_all_gather_into_tensor():
    out = on(torch.empty(WORLD * 6))
    dist.all_gather_into_tensor(out, on(data(RANK)))
    same(out, torch.cat(all_data()), "all_gather_into_tensor")
    # FSDP's layout: the input is a slice of the output
    out = on(torch.zeros(WORLD * 6))
    mine = out[6 * RANK:6 * RANK + 6]
    mine.copy_(on(data(RANK)))
    dist.all_gather_into_tensor(out, mine)
    same(out, torch.cat(all_data()), "all_gather_into_tensor in place")


def check_reduce_scatter():
    ins = [on(data(RANK, 3) * (r + 1)) for r in range(WORLD)]
    out = on(torch.empty(3))
    dist.reduce_scatter(out, ins)
    same(out, sum(data(r, 3) for r in range(WORLD)) * (RANK + 1), "reduce_scatter")


def check_reduce_scatter_tensor():
    inp = on(torch.cat([data(RANK, 2) * (r + 1) for r in range(WORLD)]))
    for op_name in ("SUM", "AVG", "MAX"):
        op, ref = REDUCTIONS[op_name]
        out = on(torch.empty(2))
        dist.reduce_scatter_tensor(out, inp, op=op)
        same(out, ref([data(r, 2) * (RANK + 1) for r in range(WORLD)]),
             f"reduce_scatter_tensor {op_name}")


def check_all_to_all():
    ins = [on(torch.full((2,), float(10 * RANK + r))) for r in range(WORLD)]
    outs = [on(torch.empty(2)) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    for r, o in enumerate(outs):
        same(o, torch.full((2,), float(10 * r + RANK)), f"all_to_all[{r}]")


def check_all_to_all_single():
    # even splits
    inp = on(torch.arange(WORLD * 2, dtype=torch.float32) + 100 * RANK)
    out = on(torch.empty(WORLD * 2))
    dist.all_to_all_single(out, inp)
    expected = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2, dtype=torch.float32) + 100 * r
                          for r in range(WORLD)])
    same(out, expected, "all_to_all_single")
    # uneven splits: rank r sends (j + 1) elements to rank j
    in_splits = [j + 1 for j in range(WORLD)]
    out_splits = [RANK + 1] * WORLD
    inp = on(torch.cat([torch.full((j + 1,), float(10 * RANK + j)) for j in range(WORLD)]))
    out = on(torch.empty(sum(out_splits)))
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    same(out, torch.cat([torch.full((RANK + 1,), float(10 * r + RANK)) for r in range(WORLD)]),
         "all_to_all_single uneven")


def check_send_recv():
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = on(torch.empty(6))
    if RANK % 2 == 0:
        dist.send(on(data(RANK)), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(on(data(RANK)), nxt)
    same(got, data(prv), "send/recv")
    # isend / irecv, and batched p2p
    got = on(torch.empty(6))
    works = [dist.isend(on(data(RANK)), nxt), dist.irecv(got, prv)]
    for w in works:
        w.wait()
    same(got, data(prv), "isend/irecv")
    got = on(torch.empty(6))
    ops = [dist.P2POp(dist.isend, on(data(RANK)), nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(got, data(prv), "batch_isend_irecv")


def check_scatter_gather():
    src = WORLD - 1
    out = on(torch.empty(6))
    dist.scatter(out, [on(data(r) * 3) for r in range(WORLD)] if RANK == src else None, src=src)
    same(out, data(RANK) * 3, "scatter")
    outs = [on(torch.empty(6)) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(on(data(RANK)), outs, dst=0)
    if RANK == 0:
        for r, o in enumerate(outs):
            same(o, data(r), f"gather[{r}]")


def check_barrier():
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()


def check_coalesced():
    pg = dist.distributed_c10d._get_default_group()
    a, b = on(data(RANK)), on(data(RANK, 4, torch.float32) * 2)
    pg.allreduce_coalesced([a, b], dist.AllreduceCoalescedOptions()).wait()
    same(a, sum(all_data()), "allreduce_coalesced[0]")
    same(b, sum(all_data(4)) * 2, "allreduce_coalesced[1]")
    outs = [on(torch.empty(WORLD * 6)), on(torch.empty(WORLD * 4))]
    pg.allgather_into_tensor_coalesced(outs, [on(data(RANK)), on(data(RANK, 4))]).wait()
    same(outs[0], torch.cat(all_data()), "allgather_into_tensor_coalesced[0]")
    same(outs[1], torch.cat(all_data(4)), "allgather_into_tensor_coalesced[1]")
    outs = [on(torch.empty(2)), on(torch.empty(1))]
    ins = [on(torch.cat([data(RANK, 2)] * WORLD)), on(torch.cat([data(RANK, 1)] * WORLD))]
    pg.reduce_scatter_tensor_coalesced(outs, ins, dist.ReduceScatterOptions()).wait()
    same(outs[0], sum(all_data(2)), "reduce_scatter_tensor_coalesced[0]")
    same(outs[1], sum(all_data(1)), "reduce_scatter_tensor_coalesced[1]")
    # the coalescing manager, as FSDP1 and DTensor use it
    outs = [on(torch.empty(WORLD * 6)), on(torch.empty(WORLD * 4))]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], on(data(RANK)))
        dist.all_gather_into_tensor(outs[1], on(data(RANK, 4)))
    cm.wait()
    same(outs[0], torch.cat(all_data()), "coalescing manager all_gather[0]")
    same(outs[1], torch.cat(all_data(4)), "coalescing manager all_gather[1]")


def check_async_work_and_future():
    t = on(data(RANK))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    value = fut.wait()
    assert isinstance(value, list) and len(value) == 1, value
    assert value[0] is t, "the future's value is not the caller's flagos tensor"
    assert work.result()[0] is t, "work.result() is not the caller's flagos tensor"
    same(t, sum(all_data()), "async all_reduce")
    # a callback chained on the future sees flagos tensors
    t2 = on(data(RANK))
    fut2 = dist.all_reduce(t2, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(fut2.wait(), sum(all_data()) * 2, "future.then")


def check_async_orders_the_current_stream():
    # On a side stream, with no synchronisation of ours: wait() on the work,
    # or on its future, must order that stream after the collective (a race
    # on the cuda driver if it did not; 1M elements keep NCCL busy a while).
    n = 1 << 20
    total = float(sum(range(1, WORLD + 1)))
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        t = on(torch.full((n,), float(RANK + 1)))
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        doubled = t * 2
        u = on(torch.full((n,), float(RANK + 1)))
        value = dist.all_reduce(u, async_op=True).get_future().wait()[0]
        plus_one = value + 1
    torch.flagos.synchronize()
    same(doubled, torch.full((n,), 2 * total), "after work.wait()")
    same(plus_one, torch.full((n,), total + 1), "after future.wait()")


def check_cpu_tensors_in_same_group():
    t = data(RANK)
    dist.all_reduce(t)
    if not torch.equal(t, sum(all_data())) or t.device.type != "cpu":
        raise AssertionError(f"CPU all_reduce: {t}")
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(WORLD)], objs


def check_group_backends():
    pg = dist.distributed_c10d._get_default_group()
    flagos = pg._get_backend(torch.device("flagos"))
    assert type(flagos).__name__ == "ProcessGroupFlagos", type(flagos)
    assert flagos.name() == "flagos"
    inner = "nccl" if torch_fl.driver() == "cuda" else "gloo"
    assert flagos.inner.name() == inner, flagos.inner.name()
    assert pg._get_backend(torch.device("cpu")).name() == "gloo"


def collectives():
    record("group_backends", check_group_backends)
    for name, op, ref, dtype in reduction_cases():
        record(name, functools.partial(check_all_reduce, op, ref, dtype))
    record("all_reduce_PREMUL_SUM_float", functools.partial(check_premul_sum, "float"))
    record("all_reduce_PREMUL_SUM_tensor", functools.partial(check_premul_sum, "tensor"))
    for fn in (check_broadcast, check_reduce, check_all_gather, check_all_gather_into_tensor,
               check_reduce_scatter, check_reduce_scatter_tensor, check_all_to_all,
               check_all_to_all_single, check_send_recv, check_scatter_gather, check_barrier,
               check_coalesced, check_async_work_and_future,
               check_async_orders_the_current_stream, check_cpu_tensors_in_same_group,
               check_sparse_all_reduce):
        record(fn.__name__[len("check_"):], fn)


def sparse_data(rank):
    """Rank `rank`'s sparse COO input: ragged nnz, repeated and shared indices."""
    g = torch.Generator().manual_seed(77 + rank)
    nnz = 3 + 2 * rank
    return torch.sparse_coo_tensor(torch.randint(0, 5, (2, nnz), generator=g),
                                   torch.randn(nnz, 3, generator=g), (5, 5, 3))


def check_sparse_all_reduce():
    # gloo's sparse all_reduce (allgathered indices and values, summed) on the
    # host driver; NCCL refuses sparse tensors, on flagos as on CUDA.
    t = on(sparse_data(RANK))
    if CUDA:
        expect_error(lambda: dist.all_reduce(t), "sparse")
        return
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    if not (t.is_sparse and t.is_coalesced() and t.device == DEVICE):
        raise AssertionError(f"sparse all_reduce gave {t.layout} on {t.device}")
    want = functools.reduce(operator.add, [sparse_data(r) for r in range(WORLD)]).coalesce()
    same(t.to_dense(), want.to_dense(), "sparse all_reduce")
    (got,) = work.get_future().wait()
    if got is not t and not torch.equal(got.to_dense().cpu(), want.to_dense()):
        raise AssertionError("sparse all_reduce: the future's value is not the sum")


# ---- subgroups and meshes -------------------------------------------------------


def check_subgroups():
    evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0])
    odds = dist.new_group([r for r in range(WORLD) if r % 2 == 1])
    mine = evens if RANK % 2 == 0 else odds
    members = [r for r in range(WORLD) if r % 2 == RANK % 2]
    t = on(data(RANK))
    dist.all_reduce(t, group=mine)
    same(t, sum(data(r) for r in members), "subgroup all_reduce")
    out = on(torch.empty(len(members) * 6))
    dist.all_gather_into_tensor(out, on(data(RANK)), group=mine)
    same(out, torch.cat([data(r) for r in members]), "subgroup all_gather_into_tensor")
    t = on(data(RANK))
    dist.broadcast(t, src=members[-1], group=mine)
    same(t, data(members[-1]), "subgroup broadcast (global src)")


def check_mesh_2d():
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("flagos", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    coords = divmod(RANK, WORLD // 2)
    for dim, name in enumerate(("dp", "tp")):
        group = mesh[name].get_group()
        peers = [r for r in range(WORLD)
                 if divmod(r, WORLD // 2)[1 - dim] == coords[1 - dim]]
        t = on(data(RANK))
        dist.all_reduce(t, group=group)
        same(t, sum(data(r) for r in peers), f"mesh[{name}] all_reduce")


def subgroups():
    record("subgroups", check_subgroups)
    if WORLD % 2 == 0 and WORLD >= 4:
        record("mesh_2d", check_mesh_2d)


# ---- training -------------------------------------------------------------------

STEPS, LR, BATCH = 3, 0.1, 4


def make_model(dtype=torch.float32):
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 4)).to(dtype)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def reference_params(device=None):
    """The same training in one process, without torch.distributed: the whole
    (all ranks') batch on this rank's device (the same kernels, so only the
    order of the reductions differs)."""
    device = device or DEVICE
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in range(WORLD)))
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs).to(device)),
                                            torch.cat(ys).to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().cpu() for k, v in model.named_parameters()}


def train(model, params):
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = (on(t) for t in batch(RANK, step))
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def close(name, got, ref, tol=1e-6):
    got = got.detach().cpu()
    diff = (got - ref).abs().max().item()
    if not diff <= tol:
        raise AssertionError(f"{name}: max |flagos - reference| = {diff:.3g} > {tol}")


def check_ddp(ref):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model().to(DEVICE)
    ddp = DDP(model, device_ids=[DEVICE.index], bucket_cap_mb=1e-4, gradient_as_bucket_view=True)
    train(ddp, ddp.parameters())
    for name, p in model.named_parameters():
        if p.device != DEVICE or p.grad is not None and p.grad.device != DEVICE:
            raise AssertionError(f"{name} left {DEVICE}")
        close(name, p, ref[name])
    # the C++ Reducer bucketed the gradients (tiny bucket_cap_mb: several
    # buckets) and timed them with flagos events (csrc/distributed/reducer_timer.cpp)
    logging = ddp._get_ddp_logging_data()
    assert logging.get("num_buckets_reduced", 0) >= 2, logging
    assert logging.get("avg_backward_compute_time", 0) > 0, logging


def check_ddp_sparse_embedding():
    """DDP over nn.Embedding(sparse=True): the sparse gradients are summed by
    the flagos backend's sparse all_reduce, against the whole batch trained in
    one process (host driver: NCCL has no sparse all_reduce)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(4321)
        return torch.nn.Sequential(torch.nn.Embedding(30, 8, sparse=True), torch.nn.Linear(8, 2))

    def ids(rank, step):
        return torch.randint(0, 30, (BATCH,), generator=torch.Generator().manual_seed(50 * step + rank))

    ddp_model = model().to(DEVICE)
    ddp = DDP(ddp_model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    ref = model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(STEPS):
        ddp(on(ids(RANK, step))).square().mean().backward()
        if not ddp_model[0].weight.grad.is_sparse:
            raise AssertionError("the embedding's gradient is not sparse")
        opt.step()
        opt.zero_grad()
        ref(torch.cat([ids(r, step) for r in range(WORLD)])).square().mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for (name, p), q in zip(ddp_model.named_parameters(), ref.parameters()):
        if p.device != DEVICE:
            raise AssertionError(f"{name} left {DEVICE}")
        close(name, p, q.detach(), tol=1e-6)


def bn_model():
    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def check_sync_batch_norm():
    """SyncBatchNorm under DDP (its statistics and their gradients reduced
    over the ranks) against BatchNorm over the whole batch in one process."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(bn_model()).to(DEVICE)
    ddp = DDP(model, device_ids=[DEVICE.index])
    train(ddp, ddp.parameters())
    ref = bn_model().to(DEVICE)
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in range(WORLD)))
        torch.nn.functional.mse_loss(ref(torch.cat(xs).to(DEVICE)),
                                     torch.cat(ys).to(DEVICE)).backward()
        opt.step()
        opt.zero_grad()
    expected = dict(ref.named_parameters()) | dict(ref.named_buffers())
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device != DEVICE:
            raise AssertionError(f"{name} left {DEVICE}")
        close(name, t.float(), expected[name].detach().cpu().float(), tol=1e-5)


def fsdp_model(mesh=None, device=None):
    """make_model() on `device` (default: this rank's), each Linear and the
    whole model fully_shard on `mesh` (None: fully_shard's default mesh)."""
    from torch.distributed.fsdp import fully_shard

    model = make_model().to(device or DEVICE)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def check_fsdp2(ref, ckpt_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import torch.distributed.checkpoint as dcp

    mesh = init_device_mesh("flagos", (WORLD,))
    model = fsdp_model(mesh)
    train(model, model.parameters())
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.to_local().device == DEVICE, (name, type(p))
        close(name, p.full_tensor(), ref[name])

    # torch.distributed.checkpoint: save the sharded state, spoil it, load it back
    state = model.state_dict()
    saved = {k: v.full_tensor().cpu().clone() for k, v in state.items()}
    dcp.save(state, checkpoint_id=ckpt_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().fill_(7.0)
    fresh = model.state_dict()
    dcp.load(fresh, checkpoint_id=ckpt_dir)
    model.load_state_dict(fresh)
    for name, p in model.named_parameters():
        got = p.full_tensor()
        if got.device != DEVICE or not torch.equal(got.cpu(), saved[name]):
            raise AssertionError(f"{name}: checkpoint did not round-trip")
    # and a fresh model of the same shape loads it too
    other = fsdp_model(mesh)
    state = other.state_dict()
    dcp.load(state, checkpoint_id=ckpt_dir)
    other.load_state_dict(state)
    for name, p in other.named_parameters():
        if not torch.equal(p.full_tensor().cpu(), saved[name]):
            raise AssertionError(f"{name}: checkpoint did not load into a new model")


def check_dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("flagos", (WORLD,))
    full = torch.arange(WORLD * 4 * 3, dtype=torch.float32).reshape(WORLD * 4, 3)
    dt = distribute_tensor(on(full), mesh, [Shard(0)])
    same(dt.to_local(), full[4 * RANK:4 * RANK + 4], "Shard(0) local")
    same(dt.redistribute(mesh, [Replicate()]).to_local(), full, "redistribute to Replicate")
    same((dt * 2).sum(dim=0).full_tensor(), (full * 2).sum(dim=0), "sum over the sharded dim")
    rep = distribute_tensor(on(full), mesh, [Replicate()])
    same(rep.redistribute(mesh, [Shard(1)]).full_tensor(), full, "Replicate to Shard(1)")


def check_dtensor_random():
    """Random operators on DTensors of a flagos mesh (FSDP2's meta-device init
    then reset_parameters(), dropout) equal the same on a CPU mesh: on the
    host driver flagos' generator is the CPU's, so DTensor takes the CPU's path."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    def run(device):
        mesh = init_device_mesh(device, (WORLD,))
        with torch.device("meta"):
            layer = torch.nn.Linear(8, 6)
        fully_shard(layer, mesh=mesh)
        layer.to_empty(device=DEVICE if device == "flagos" else "cpu")
        torch.manual_seed(5 + RANK)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "may not have complete support on ... mesh"
            layer.reset_parameters()
            x = distribute_tensor(torch.ones(4 * WORLD, 6, device=mesh.device_type), mesh, [Shard(0)])
            dropped = torch.nn.functional.dropout(x, 0.5)
        return [layer.weight.full_tensor(), layer.bias.full_tensor(), dropped.full_tensor()]

    for got, want in zip(run("flagos"), run("cpu")):
        same(got, want, "DTensor random operator")


def training():
    ref = reference_params()
    record("ddp", functools.partial(check_ddp, ref))
    if not CUDA:
        record("ddp_sparse_embedding", check_ddp_sparse_embedding)
        record("dtensor_random", check_dtensor_random)
    record("sync_batch_norm", check_sync_batch_norm)
    record("fsdp2_and_checkpoint", functools.partial(check_fsdp2, ref, os.path.join(OUT, "ckpt")))
    record("dtensor", check_dtensor)


# ---- errors -----------------------------------------------------------------------


def errors():
    pg = dist.distributed_c10d._get_default_group()
    other = torch.device("flagos", (DEVICE.index + 1) % torch.flagos.device_count())

    record("cpu_tensor_to_flagos_backend", lambda: expect_error(
        lambda: pg._get_backend(torch.device("flagos")).allreduce([torch.ones(3)]),
        "flagos backend", "all_reduce", "tensors[0]", "cpu"))
    record("cpu_input_with_flagos_output", lambda: expect_error(
        lambda: dist.all_gather_into_tensor(on(torch.empty(WORLD * 6)), data(RANK)),
        "all_gather_into_tensor", "input_tensor", "cpu"))
    record("tensors_on_two_flagos_devices", lambda: expect_error(
        lambda: dist.all_gather([on(torch.empty(6)) for _ in range(WORLD - 1)]
                                + [torch.empty(6, device=other)], on(data(RANK))),
        "all_gather", f"output_tensor_lists[0][{WORLD - 1}]", str(other), str(DEVICE),
        "one flagos device"))
    record("all_gather_list_of_wrong_world_size", lambda: expect_error(
        lambda: dist.all_gather([on(torch.empty(6)) for _ in range(WORLD + 1)], on(data(RANK))),
        "all_gather", f"has {WORLD + 1} tensors", f"{WORLD} ranks", f"needs {WORLD}"))
    record("all_gather_into_tensor_wrong_size", lambda: expect_error(
        lambda: dist.all_gather_into_tensor(on(torch.empty(WORLD * 6 + 1)), on(data(RANK))),
        "all_gather_into_tensor", f"{WORLD * 6 + 1} elements", f"needs {WORLD * 6}"))
    record("reduce_scatter_tensor_wrong_size", lambda: expect_error(
        lambda: dist.reduce_scatter_tensor(on(torch.empty(3)), on(torch.empty(WORLD * 6))),
        "reduce_scatter_tensor", f"{WORLD * 6} elements", f"needs {WORLD * 3}"))
    record("output_of_another_dtype", lambda: expect_error(
        lambda: dist.all_gather_into_tensor(on(torch.empty(WORLD * 6, dtype=torch.float64)),
                                            on(data(RANK))),
        "all_gather_into_tensor", "output_tensor is Double", "input_tensor is Float",
        "input's dtype", kind=TypeError))  # NCCL's type too
    # A sparse collective other than all_reduce would complete into the native
    # twins: refused, never a silent no-op.
    record("sparse_broadcast_refused", lambda: expect_error(
        lambda: dist.broadcast(on(data(RANK)).to_sparse(), src=0),
        "broadcast_", "nested or sparse flagos tensors", ".to_dense()", kind=NotImplementedError))
    # Sparse all_reduce sums only; the inner backend says so (gloo), or refuses
    # sparse tensors outright (NCCL).
    record("sparse_all_reduce_max", lambda: expect_error(
        lambda: dist.all_reduce(on(data(RANK)).to_sparse(), op=R.MAX),
        "sparse" if CUDA else "only works with ReduceOp.SUM"))
    record("all_to_all_wrong_world_size", lambda: expect_error(
        lambda: dist.all_to_all([on(torch.empty(2))] * (WORLD + 1), [on(torch.empty(2))] * (WORLD + 1)),
        "all_to_all", f"{WORLD} ranks"))

    def still_works():
        t = on(data(RANK))
        dist.all_reduce(t)
        same(t, sum(all_data()), "all_reduce after the errors")

    record("group_usable_after_errors", still_works)


# ---- faults -------------------------------------------------------------------------


def job_killed_peer():
    init()
    t = on(data(RANK))
    dist.all_reduce(t)
    if RANK == 1:
        os._exit(0)  # dies without a word to its peers
    time.sleep(0.5)

    record("killed_peer_raises", lambda: timed_error(
        "killed_peer", lambda: dist.all_reduce(on(data(RANK))), ""))


def job_timeout():
    init()
    if RANK == 1:
        # alive, but never joins the collective; leaves once rank 0 has reported
        deadline = time.monotonic() + TIMEOUT.total_seconds() + 30
        while time.monotonic() < deadline and not os.path.exists(
                os.path.join(OUT, f"{JOB}.rank0.json")):
            time.sleep(0.1)
        os._exit(0)

    record("timeout_raises", lambda: timed_error(
        "timeout", lambda: dist.all_reduce(on(data(RANK))), ""))


def job_wrong_world_size():
    # WORLD_SIZE says one more process than was started
    record("wrong_world_size_raises", lambda: timed_error(
        "wrong_world_size", lambda: dist.init_process_group(
            None, init_method=f"file://{OUT}/store", rank=RANK, world_size=WORLD + 1,
            timeout=TIMEOUT), "flagos backend", f"group of {WORLD + 1}",
        f"world_size ({WORLD + 1})"))


# ---- torchrun -------------------------------------------------------------------------


def check_fsdp2_default_mesh():
    # fully_shard without a mesh takes the accelerator's (flagos) and moves
    # the CPU model there, as it moves one to CUDA.
    model = fsdp_model(device="cpu")  # fully_shard moves it
    assert next(model.parameters()).to_local().device == DEVICE
    train(model, model.parameters())
    ref = reference_params()
    for name, p in model.named_parameters():
        close(name, p.full_tensor(), ref[name])



def job_torchrun():
    """Started by torchrun: no init_process_group of our own (DeviceMesh makes
    the default group from torchrun's environment)."""
    from torch.distributed.device_mesh import init_device_mesh

    local_rank = int(os.environ["LOCAL_RANK"])

    def cpu_fsdp2():
        # The regression: with torch_fl loaded the accelerator is flagos, and
        # DeviceMesh's bare init_process_group() had no backend for it.
        model = fsdp_model(init_device_mesh("cpu", (WORLD,)), device="cpu")
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        for step in range(STEPS):
            x, y = batch(RANK, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        ref = reference_params("cpu")
        for name, p in model.named_parameters():
            assert p.to_local().device.type == "cpu"
            close(name, p.full_tensor(), ref[name])

    def local_rank_is_device():
        assert torch.flagos.current_device() == local_rank, torch.flagos.current_device()
        t = torch.ones(3, device="flagos") * (RANK + 1)
        assert t.device == torch.device("flagos", local_rank), t.device
        dist.all_reduce(t)
        same(t, torch.full((3,), float(sum(range(1, WORLD + 1)))), "all_reduce")

    record("cpu_fsdp2_with_torch_fl_loaded", cpu_fsdp2)
    record("local_rank_is_the_flagos_device", local_rank_is_device)
    record("fsdp2_default_mesh_is_flagos", check_fsdp2_default_mesh)
    results["backend"] = dist.get_backend()


# ---- a group asked for by a collective library's name --------------------------------------


def job_gloo():
    """init_process_group("gloo"), as a CUDA program moved to flagos asks: CPU
    tensors go to gloo, flagos tensors to the flagos backend, and FSDP2's
    default mesh (the accelerator's, flagos) trains."""
    init()
    results["backend"] = dist.get_backend()
    record("group_backends", check_group_backends)
    record("all_reduce_SUM_float32", functools.partial(
        check_all_reduce, *next(c[1:] for c in reduction_cases() if c[0] == "all_reduce_SUM_float32")))
    record("cpu_tensors_in_same_group", check_cpu_tensors_in_same_group)
    record("fsdp2_default_mesh", check_fsdp2_default_mesh)


def job_cpu_only():
    """A CPU-only program under torchrun, with more processes than flagos
    devices: a group asked for as "gloo", then a bare one, must work as
    without torch_fl, and the gloo group must leave flagos untouched."""
    for backend in ("gloo", None):
        name = backend or "bare"

        def cpu_all_reduce():
            dist.init_process_group(backend, timeout=TIMEOUT)
            t = data(RANK)
            dist.all_reduce(t)
            if not torch.equal(t, sum(all_data())):
                raise AssertionError(f"CPU all_reduce gave {t}")
            if backend == "gloo" and torch.flagos.is_initialized():
                raise AssertionError("init_process_group('gloo') initialised flagos")

        record(f"cpu_all_reduce_{name}", cpu_all_reduce)
        if dist.is_initialized():
            dist.destroy_process_group()


# ---- main ---------------------------------------------------------------------------------

def job_main():
    init()
    results["backend"] = dist.get_backend()
    collectives()
    subgroups()
    training()
    errors()


JOBS = {
    "main": job_main,
    "killed_peer": job_killed_peer,
    "timeout": job_timeout,
    "wrong_world_size": job_wrong_world_size,
    "cpu_only": job_cpu_only,
    "torchrun": job_torchrun,
    "gloo": job_gloo,
}


def main():
    global DEVICE
    # torchrun's job leaves the device alone: LOCAL_RANK must pick it.
    DEVICE = torch.device("flagos", int(os.environ.get("LOCAL_RANK", RANK)))
    if JOB not in ("torchrun", "cpu_only"):
        torch.flagos.set_device(DEVICE)
    try:
        JOBS[JOB]()
    finally:
        with open(os.path.join(OUT, f"{JOB}.rank{RANK}.json"), "w") as f:
            json.dump(results, f, indent=1)
    if JOB in ("killed_peer", "timeout", "wrong_world_size"):
        os._exit(0)  # a broken group: nothing to tear down cleanly
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The node proof, run by the deployment image's python3 in a short-lived container on every node
before any serving container (components/node_proof): `python3 - SPEC`.

1. The GPU step, when SPEC's `gpu` is true (the stack gives its containers the GPU): torch sees a
   CUDA device; a small BF16 matmul, an FP8 scaled matmul (where the device and torch have FP8) and
   one of vLLM's own custom ops (RMSNorm) run on it, each synchronised, so an image whose kernels
   were not built for this GPU fails here ("no kernel image is available"), not after a 120 GB
   load; the free and total memory as CUDA reports them.
2. The group: every node's proof joins one torch.distributed group (NCCL with the GPU, gloo without)
   at the head's fabric address and port, checks one all-reduce's sum, then times a sized all-reduce:
   bus bandwidth = bytes x 2(n-1)/n / seconds, as nccl-tests computes it. NCCL's own INFO lines (its
   network, HCAs, GID index) go to stdout with the report; the orchestrator reads them.

The report is one JSON line, the last the program prints (after NCCL's own); a deadline thread ends the
program with a report of what it reached when the group hangs (a peer that never joins). Standard
library only at import: torch is imported inside, so a missing torch is a report, not a traceback.
SPEC: {node, rank, world, master_addr, port, gpu, bytes, iterations, deadline_s}; with `gpu` the
group is NCCL's, without it gloo's.
"""

import datetime
import json
import os
import sys
import threading
import time

REPORT = {"steps": {}}
STARTED = time.monotonic()
LOCK = threading.Lock()


class Exit:
    OK = 0
    USAGE = 2
    FAILED = 3
    DEADLINE = 4


def emit(code):
    with LOCK:
        sys.stderr.flush()
        flush_c_stdio()  # NCCL's lines, written by C stdio to the same stdout, before the report
        sys.stdout.write("\n" + json.dumps(REPORT, sort_keys=True) + "\n")
        sys.stdout.flush()
        os._exit(code)


def flush_c_stdio():
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 -- no libc to flush is nothing lost
        pass


def last_line(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def step(name, run):
    """Run one step; its result (or its error line) lands in REPORT['steps'][name]. While it runs,
    REPORT['running'] names it: a deadline report says which step the bound cut."""
    started = time.monotonic()
    REPORT["running"] = name
    try:
        found = run()
        REPORT["steps"][name] = {"ok": True, "s": round(time.monotonic() - started, 3), **(found or {})}
        return True
    except Exception as exc:  # the error line is the finding
        REPORT["steps"][name] = {"ok": False, "error": last_line(exc)}
        return False
    finally:
        REPORT.pop("running", None)


def gpu_steps(torch):
    def device():
        if torch.version.cuda is None:  # a `+cpu` wheel: no container setting gives it the GPU
            raise RuntimeError(
                f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): "
                "it sees no CUDA device"
            )
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
            )
        props = torch.cuda.get_device_properties(0)
        return {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "arch_list": list(torch.cuda.get_arch_list()),
        }

    def bf16():
        a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        out = a @ a
        torch.cuda.synchronize()
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("the BF16 matmul gave non-finite values")

    def fp8():
        major, minor = torch.cuda.get_device_capability(0)
        if (major, minor) < (8, 9) or not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            return {"skipped": f"no FP8 matmul on capability {major}.{minor} with torch {torch.__version__}"}
        x = torch.randn(32, 64, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(32, 64, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.tensor(1.0, device="cuda")
        out = torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("the FP8 scaled matmul gave non-finite values")

    def vllm_op():
        from vllm import _custom_ops as ops

        x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
        weight = torch.ones(256, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        ops.rms_norm(out, x, weight, 1e-6)
        torch.cuda.synchronize()
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("vLLM's rms_norm gave non-finite values")
        return {"op": "rms_norm"}

    def memory():
        free, total = torch.cuda.mem_get_info()
        return {"free_bytes": int(free), "total_bytes": int(total)}

    for name, run in (("gpu", device), ("bf16_matmul", bf16), ("fp8_scaled_mm", fp8),
                      ("vllm_op", vllm_op), ("gpu_memory", memory)):  # fmt: skip
        if not step(name, run) and name == "gpu":
            return False
    return all(entry.get("ok") for entry in REPORT["steps"].values())


def bandwidth(size, seconds, world):
    """An all-reduce's algorithm and bus bandwidth in GB/s, as nccl-tests computes them: algbw is
    bytes over seconds; busbw scales it by 2(n-1)/n, the share of the data each rank sends and
    receives in a ring, so the figure compares with the link's speed whatever the world size."""
    factor = 2 * (world - 1) / world
    return {"algbw_gbs": size / seconds / 1e9, "busbw_gbs": size * factor / seconds / 1e9}


def group_steps(torch, spec, backend):
    import torch.distributed as dist

    device = "cuda" if backend == "nccl" else "cpu"
    world = int(spec["world"])

    def join():
        # What is left of the bound (the import and the GPU step took the rest): the join gives up, and
        # says whom it waited for, before the deadline thread ends the program.
        left = max(5.0, float(spec["deadline_s"]) - (time.monotonic() - STARTED))
        dist.init_process_group(
            backend,
            init_method=f"tcp://{spec['master_addr']}:{int(spec['port'])}",
            rank=int(spec["rank"]),
            world_size=world,
            timeout=datetime.timedelta(seconds=left),
        )
        return {"backend": backend, "world": world}

    if world == 1:  # one node: no group to form, no port to listen on
        REPORT["steps"]["join"] = {"ok": True, "backend": backend, "world": 1, "skipped": "one node"}
        return True

    def all_reduce():
        value = torch.full((4,), float(spec["rank"]) + 1.0, device=device)
        dist.all_reduce(value)
        expected = world * (world + 1) / 2
        if not bool((value == expected).all()):
            raise RuntimeError(f"the all-reduce summed to {value.tolist()}, not {expected}")

    def sized():
        count = max(1, int(spec["bytes"]) // 4)
        tensor = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up: connections made, buffers registered
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        iterations = max(1, int(spec["iterations"]))
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor)
        sync()
        seconds = (time.perf_counter() - started) / iterations
        figures = bandwidth(count * 4, seconds, world)  # a world of one returned before any group
        return {"bytes": count * 4, "iterations": iterations, "seconds": seconds, **figures}

    ok = step("join", join) and step("all_reduce", all_reduce) and step("sized_all_reduce", sized)
    if dist.is_initialized():
        dist.destroy_process_group()
    return ok


def deadline(seconds):
    time.sleep(seconds)
    REPORT["deadline"] = f"the proof did not finish within {seconds:.0f}s"
    emit(Exit.DEADLINE)


def main(argv):
    try:
        spec = json.loads(argv[1])
        REPORT.update(node=str(spec["node"]), rank=int(spec["rank"]), world=int(spec["world"]))
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        REPORT["error"] = f"usage: python3 - SPEC ({exc})"
        emit(Exit.USAGE)
    threading.Thread(target=deadline, args=(float(spec["deadline_s"]) + 15.0,), daemon=True).start()
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 -- whatever the image's torch raises is the finding
        REPORT["error"] = f"the image's python3 cannot import torch: {last_line(exc)}"
        emit(Exit.FAILED)
    REPORT["torch"] = torch.__version__
    gpu_ok = gpu_steps(torch) if spec["gpu"] else True
    backend = "nccl" if spec["gpu"] else "gloo"
    if backend == "nccl" and not REPORT["steps"]["gpu"]["ok"]:
        REPORT["steps"]["join"] = {"ok": False, "error": "not joined: NCCL needs the GPU this node lacks"}
        emit(Exit.FAILED)
    group_ok = group_steps(torch, spec, backend)
    emit(Exit.OK if gpu_ok and group_ok else Exit.FAILED)


if __name__ == "__main__":
    main(sys.argv)

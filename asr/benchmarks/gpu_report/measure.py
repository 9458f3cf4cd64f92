"""The GPU report's measuring parts that are not another command: run as
`python -m asr.benchmarks.gpu_report.measure PART --out DIR`, each writes <DIR>/parts/<PART>.data.json
(checks, a Markdown summary, files) and prints `RESULT <that path>` (parts.read_json_part).

    profiles          torch.profiler of clustered-100 and i-clustered-100 at N=4096 and i-clustered-100 at
                      N=65,536, each with the extension's kernels and (where triton is installed) the Triton ones
    centroid_routes   clustered attention's centroid part, route "unfused" against "sdpa", alternately
                      (`--device cpu --routes fused unfused sdpa`: the same on this CPU, a table printed)
    training          200 steps of the demo preset through `python -m asr.train` (a subprocess): eager,
                      compiled (--compile true) or with CUDA graphs (--graphs true)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from attention_ext import build_attention, parse_attention_spec
from attention_ext.attentions.clustered import centroid_routes, kernel_routes
from attention_ext.attentions.clustered_triton import TRITON_AVAILABLE

PAPER_SHAPE = dict(batch=1, heads=6, dim=64)


def _inputs(batch: int, heads: int, length: int, dim: int, dtype: torch.dtype, device: str, seed: int = 0):
    generator = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, device=device, dtype=dtype, generator=generator,
                        requires_grad=True) for _ in range(3)]


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _pass(attention, q, k, v, lengths) -> None:
    for t in (q, k, v):
        t.grad = None
    attention(q, k, v, lengths).sum().backward()


def profile_summary(spec: str, length: int, dtype: torch.dtype, out: Path, device: str = "cuda",
                    kernels: str | None = None) -> tuple[str, dict]:
    """Three forward+backward passes under torch.profiler (after three warm-ups): wall time per pass,
    GPU kernel time per pass, the gap between them (launches, host work, syncs), kernels per pass;
    the operator table by CUDA time goes to a file. `kernels`: the kernel route of clustered and
    i-clustered for the run ("extension", "triton"; attention_ext.attentions.clustered.kernel_routes), None
    for the dispatch's choice."""
    with kernel_routes.forced(device, kernels or None):
        return _profile(spec, length, dtype, out, device, kernels)


def _profile(spec: str, length: int, dtype: torch.dtype, out: Path, device: str, kernels: str | None):
    from torch.profiler import ProfilerActivity, profile
    attention = parse_attention_spec(spec).build()
    q, k, v = _inputs(PAPER_SHAPE["batch"], PAPER_SHAPE["heads"], length, PAPER_SHAPE["dim"], dtype, device)
    lengths = torch.full((1,), length, device=device)
    for _ in range(3):
        _pass(attention, q, k, v, lengths)
    _synchronize(device)
    passes = 3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(passes):
            _pass(attention, q, k, v, lengths)
        _synchronize(device)
        wall_ms = (time.perf_counter() - start) * 1000 / passes
    kernel_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_ms = sum(e.time_range.elapsed_us() for e in kernel_events) / 1000 / passes
    route = f"_{kernels}" if kernels else ""
    name = f"profile_{spec}_{length}_{str(dtype).replace('torch.', '')}{route}.txt"
    table = prof.key_averages().table(sort_by="cuda_time_total" if device == "cuda" else "cpu_time_total",
                                      row_limit=25)
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    (out / "profiles" / name).write_text(table + "\n")
    numbers = dict(spec=spec, length=length, dtype=str(dtype), kernels=kernels or "default", wall_ms=wall_ms,
                   kernel_ms=kernel_ms, gap_ms=wall_ms - kernel_ms, kernels_per_pass=len(kernel_events) / passes)
    top = "\n".join(table.splitlines()[:16])
    text = (f"**{spec}, N={length}, {numbers['dtype']}{', kernel route ' + kernels if kernels else ''}**: "
            f"{wall_ms:.2f} ms per forward+backward, "
            f"GPU kernels busy {kernel_ms:.2f} ms ({100 * kernel_ms / wall_ms:.0f} %), "
            f"{len(kernel_events) / passes:.0f} kernels per pass; the rest ({wall_ms - kernel_ms:.2f} ms) is "
            f"launches, host work and syncs. Top operators (full table: profiles/{name}):\n\n```\n{top}\n```")
    return text, numbers


# clustered-100 and i-clustered-100 at N=4096 (the GPU aims: <= 0.5 and <= 1.0 ms, GPU busy >= 70 %) and
# i-clustered-100 at 65,536, in bfloat16 (the aims' dtype), each with the extension's kernels (before) and
# the Triton kernels (after). (spec, N, dtype)
PROFILE_CASES = (("clustered-100", 4096, torch.bfloat16), ("i-clustered-100", 4096, torch.bfloat16),
                 ("i-clustered-100", 65536, torch.bfloat16))


def profile_table(numbers: list[dict]) -> str:
    """Markdown: per profile, the kernel route, ms per pass, GPU busy time and share, kernels per pass."""
    lines = ["| attention | N | dtype | kernels | ms per pass | GPU busy ms | GPU busy | kernels per pass |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {n['spec']} | {n['length']} | {n['dtype'].replace('torch.', '')} | {n['kernels']} | "
              f"{n['wall_ms']:.2f} | {n['kernel_ms']:.2f} | {100 * n['kernel_ms'] / n['wall_ms']:.0f} % | "
              f"{n['kernels_per_pass']:.0f} |" for n in numbers]
    return "\n".join(lines)


def run_profiles(out: Path, cases=PROFILE_CASES, device: str = "cuda") -> dict:
    texts, numbers, checks = [], [], []
    routes = ("extension", "triton") if TRITON_AVAILABLE else ("extension",)
    for spec, length, dtype in cases:
        for kernels in routes:
            what = f"{spec} at N={length} in {dtype}, kernel route {kernels}, ran under the profiler"
            try:
                text, values = profile_summary(spec, length, dtype, out, device, kernels)
                texts.append(text)
                numbers.append(values)
                checks.append(dict(what=what, ok=True, detail=""))
            except Exception as error:   # one failed profile must not hide the others
                checks.append(dict(what=what, ok=False, detail=f"{type(error).__name__}: {error}"[:300]))
    files = sorted(str(p.relative_to(out)) for p in (out / "profiles").glob("*.txt"))
    summary = "\n\n".join([profile_table(numbers)] + texts) if numbers else ""
    return dict(checks=checks, summary=summary, files=files, numbers=numbers)


def time_route(route: str, spec: str, shape: dict, length: int, dtype: torch.dtype, lengths, repeats: int,
               device: str = "cuda") -> list[float]:
    """Milliseconds of `repeats` forward+backward passes (after one untimed) with the centroid route `route`."""
    with centroid_routes.forced(device, route):
        attention = parse_attention_spec(spec).build()
        q, k, v = _inputs(shape["batch"], shape["heads"], length, shape["dim"], dtype, device)
        times = []
        for index in range(repeats + 1):
            _synchronize(device)
            start = time.perf_counter()
            _pass(attention, q, k, v, lengths)
            _synchronize(device)
            if index:
                times.append((time.perf_counter() - start) * 1000)
        return times


def route_outputs_agree(length: int, dtype: torch.dtype, lengths, device: str = "cuda") -> tuple[bool, str]:
    """The two routes' outputs for one seeded call, compared within the dtype's rounding."""
    results = {}
    for route in ("unfused", "sdpa"):
        with centroid_routes.forced(device, route):
            q, k, v = _inputs(lengths.shape[0], 4, length, 64, dtype, device, seed=1)
            torch.manual_seed(3)
            results[route] = build_attention("clustered", clusters=100)(q, k, v, lengths).detach().float()
    difference = float((results["sdpa"] - results["unfused"]).abs().max())
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    return difference <= tolerance, f"max |sdpa - unfused| = {difference:.2e} (tolerance {tolerance:g})"


ROUTE_CASES = ([("paper", PAPER_SHAPE, n, False) for n in (1024, 4096, 16384, 65536)]
               + [("asr, padded", dict(batch=32, heads=4, dim=64), n, True) for n in (512, 1024, 2048)])


def run_centroid_routes(out: Path, repeats: int = 10, cases=ROUTE_CASES, device: str = "cuda",
                        dtypes=(torch.bfloat16, torch.float32), routes=("unfused", "sdpa")) -> dict:
    """clustered-100 with each centroid route of `routes`, alternately (each timed `repeats` times per
    round, two rounds): by default on CUDA the paper shape without padding (FlashAttention can run)
    and the ASR shape with padding. `cases`: (label, shape, N, padded)."""
    rows, checks = [], []
    for dtype in dtypes:
        for label, shape, length, padded in cases:
            # Without lengths the attention masks no key, so SDPA may take FlashAttention.
            lengths = (torch.linspace(length // 2, length, shape["batch"], device=device).long() if padded
                       else None)
            times = {route: [] for route in routes}
            try:
                for _ in range(2):
                    for route in times:
                        times[route] += time_route(route, "clustered-100", shape, length, dtype, lengths, repeats,
                                                   device)
            except torch.OutOfMemoryError:
                rows.append((str(dtype).replace("torch.", ""), label, length) + ("out of memory",) * len(routes)
                            + ("", ""))
                torch.cuda.empty_cache()
                continue
            medians = {route: statistics.median(t) for route, t in times.items()}
            fastest = min(medians, key=medians.get)
            rows.append((str(dtype).replace("torch.", ""), label, length)
                        + tuple(f"{medians[r]:.3f}" for r in routes)
                        + (f"{medians[routes[0]] / medians[routes[-1]]:.2f}x", fastest))
        length = max(case[2] for case in cases if case[2] <= 1024)
        ok, detail = route_outputs_agree(length, dtype, torch.tensor([length, length // 3], device=device), device)
        checks.append(dict(what=f"routes sdpa and unfused agree ({dtype}, padded)", ok=ok, detail=detail))
    columns = ["dtype", "shape", "N"] + [f"{r} ms" for r in routes] + [f"{routes[0]} / {routes[-1]}", "fastest"]
    table = ("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
             + "\n".join("| " + " | ".join(str(c) for c in row) + " |" for row in rows))
    wins = [row for row in rows if row[-1] == "sdpa"]
    verdict = (f"sdpa is the fastest in {len(wins)} of {len(rows)} cells; choose it with "
               f"`with attention_ext.attentions.clustered.centroid_routes.forced('{device}', 'sdpa'):` (or make it "
               "preferred in clustered.py's `_centroid_preference`) where it wins at the lengths you train at.")
    (out / "csv").mkdir(parents=True, exist_ok=True)
    path = out / "csv" / f"centroid_routes{'' if device == 'cuda' else '_' + device}.csv"
    path.write_text(",".join(c.replace(" ", "_") for c in columns) + "\n"
                    + "\n".join(",".join(str(c) for c in row) for row in rows) + "\n")
    return dict(checks=checks, summary=f"clustered-100, forward+backward, median of {2 * repeats} per route, "
                f"alternating:\n\n{table}\n\n{verdict}", files=[str(path.relative_to(out))], rows=rows)


def run_training(out: Path, compiled: bool, name: str, steps: int = 200, graphs: bool = False) -> None:
    """Runs `python -m asr.train` (the demo preset) for `steps` steps on one GPU and prints its run
    folder; parts.read_training reads its results.json. A smaller corpus (800 training utterances)
    than the demo's, generated once into <out>/synth (or linked there by gpu_report --corpus), so both
    runs use it."""
    run_dir = out / "runs" / name
    command = [sys.executable, "-m", "asr.train", f"run_dir={run_dir}", f"data.root={out / 'synth'}",
               "synth_corpus.train_utterances=800", f"trainer.max_steps={steps}", "trainer.max_epochs=-1",
               "trainer.max_minutes=null", "trainer.accelerator=gpu", "trainer.devices=1", "test=false",
               f"trainer.compile={str(compiled).lower()}"]
    if graphs:   # the demo's own batches, padded to one shape per bucket, the encoder as CUDA graphs
        command += ["trainer.cuda_graphs=true", "data.fixed_batch_shapes=true"]
    print(" ".join(command), flush=True)
    status = subprocess.call(command)
    print(f"run folder: {run_dir}", flush=True)
    if status:
        sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.benchmarks.gpu_report.measure")
    parser.add_argument("part", choices=("profiles", "centroid_routes", "training"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compile", choices=("true", "false"), default="false")
    parser.add_argument("--graphs", choices=("true", "false"), default="false", help="training: trainer.cuda_graphs=true")
    parser.add_argument("--name", default="eager")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="centroid_routes only: cpu compares the routes on this machine (table printed)")
    parser.add_argument("--routes", nargs="+", default=["unfused", "sdpa"], help="centroid_routes only")
    parser.add_argument("--lengths", nargs="+", type=int, default=None,
                        help="centroid_routes only: N of the paper shape (batch 1, 6 heads x 64), no padding")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the cpu (default: 2)")
    args = parser.parse_args(argv)
    if args.part == "centroid_routes" and args.device == "cpu":
        torch.set_num_threads(args.threads)
        cases = [("paper", PAPER_SHAPE, n, False) for n in (args.lengths or [1024, 4096])]
        data = run_centroid_routes(args.out, args.repeats, cases, "cpu", (torch.float32,), tuple(args.routes))
        print(f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} threads")
        print(data["summary"])
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False")
        return 2
    if args.part == "training":
        run_training(args.out, args.compile == "true", args.name, graphs=args.graphs == "true")
        return 0
    data = run_profiles(args.out) if args.part == "profiles" else run_centroid_routes(args.out)
    path = args.out / "parts" / f"{args.part}.data.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"RESULT {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

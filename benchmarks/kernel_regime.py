"""The real pair's compute regime on this CPU: what ``dtype = "auto"`` chooses, and what the
measured kernel paths do to the verification pass in each precision.

    python benchmarks/kernel_regime.py [--pair models/smollm2-chat] [--cpu 1] [--rounds 12]

One torch thread pinned to --cpu (the services' placement in the main job), a 100-token context.
Four targets are loaded side by side, float32 and bfloat16 each on PyTorch's default path
(``aten``) and on the paths chosen at load (``kernels = "auto"``), and timed interleaved, round
after round, over 1, 3, 5 and 9 new positions; the draft likewise at one position. Ratios are of
medians within one precision and path (a verification pass over the same model's decode step),
so a drift of the machine's speed cancels. The precision choice is resolved the way the services
resolve it (dsd.backends.precision; not from the cache: timed again here).

A path this CPU does not run (oneDNN's bfloat16 path without AVX512-BF16) is not offered, so on
such a CPU bfloat16's chosen paths are PyTorch's default, emulated.

Prints one key=value line: ``cpu`` (the model and what PyTorch runs on it), ``cpu_flags_bf16``
(amx_bf16 / avx512_bf16 / none), ``chosen_dtype``,
``t_ar_ms`` (chosen precision and paths), ``verify3_over_ar``, ``verify5_over_ar`` (chosen),
``fp32_verify3_over_ar``, ``fp32_verify5_over_ar`` (float32 forced, chosen paths),
``bf16_verify3_over_ar``, ``bf16_verify5_over_ar``, the same on the default path
(``*_aten_*``), ``draft_step_over_ar`` (the draft in its chosen precision over the chosen
target's step), and the kernel paths chosen. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.kernels import ATEN, PATHS  # noqa: E402
from dsd.backends.machine import CpuCapability, cpu_flags  # noqa: E402
from dsd.backends.precision import PrecisionTimes, choose  # noqa: E402
from dsd.backends.torch_lm import TorchLM, TorchLMConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POSITIONS = (1, 3, 5, 9)
CONTEXT_TOKENS = 100


def load(folder: Path, dtype: str, paths: tuple[str, ...]) -> TorchLM:
    """Paths timed afresh here (not this machine's kept choice): the benchmark measures the choosing."""
    return TorchLM.load(TorchLMConfig(str(folder), dtype, kernel_paths=paths, kernel_store=False))


def timed_rounds(models: dict, rounds: int) -> dict:
    """Median seconds per (label, positions); every model and size once per round, in turn."""
    vocab = min(m.vocab_size for m in models.values())
    context = [(7 * i + 11) % vocab for i in range(CONTEXT_TOKENS)]
    sizes = {label: (POSITIONS if label[0] == "target" else (1,)) for label in models}
    for label, model in models.items():
        model.logits("regime", context, 1)
    samples = {(label, n): [] for label in models for n in sizes[label]}
    for r in range(rounds + 1):  # round 0 warms up
        for label, model in models.items():
            for n in sizes[label]:
                extra = [(3 * j + r) % vocab for j in range(n)]
                start = time.perf_counter()
                model.logits("regime", context + extra, n)
                if r:
                    samples[(label, n)].append(time.perf_counter() - start)
        print(f"round {r}/{rounds}", file=sys.stderr, flush=True)
    return {key: statistics.median(values) for key, values in samples.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=REPO / "models" / "smollm2-chat")
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: the last one)")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    for part in ("target", "draft"):
        if not (args.pair / part / "config.json").is_file():
            parser.error(
                f"--pair {args.pair}: no {part}/ model (for the shipped pair: "
                f"python -m pairs.build --family smollm2 --out {args.pair} --target-only)"
            )
    return args


def load_models(pair: Path) -> dict:
    """(part, dtype, kernel paths) -> the model: the target with ATen's kernels and with the
    automatic choice, the draft with the automatic choice, in float32 and bfloat16."""
    models = {}
    for dtype in ("float32", "bfloat16"):
        for paths_name, paths in (("aten", (ATEN,)), ("auto", PATHS)):
            print(f"loading the target in {dtype}, kernels {paths_name} ...", file=sys.stderr, flush=True)
            models[("target", dtype, paths_name)] = load(pair / "target", dtype, paths)
        models[("draft", dtype, "auto")] = load(pair / "draft", dtype, PATHS)
    return models


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    models = load_models(args.pair)
    t = timed_rounds(models, args.rounds)

    def ratio(dtype: str, paths: str, n: int) -> float:
        return round(t[(("target", dtype, paths), n)] / t[(("target", dtype, paths), 1)], 4)

    table = [
        PrecisionTimes(
            d,
            t[(("target", d, "auto"), 1)],
            {n: t[(("target", d, "auto"), n)] for n in (3, 5)},
            t[(("draft", d, "auto"), 1)],
        )
        for d in ("float32", "bfloat16")
    ]
    target_dtype, draft_dtype = choose(table)
    flags = cpu_flags()
    figures = {
        "cpu": f'"{CpuCapability.of_this_machine().describe()}"',
        "cpu_flags_bf16": "amx_bf16" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none",
        "cpu_pinned": cpu,
        "chosen_dtype": target_dtype,
        "chosen_draft_dtype": draft_dtype,
        "t_ar_ms": round(1e3 * t[(("target", target_dtype, "auto"), 1)], 2),
        "verify3_over_ar": ratio(target_dtype, "auto", 3),
        "verify5_over_ar": ratio(target_dtype, "auto", 5),
        "fp32_verify3_over_ar": ratio("float32", "auto", 3),
        "fp32_verify5_over_ar": ratio("float32", "auto", 5),
        "fp32_verify9_over_ar": ratio("float32", "auto", 9),
        "bf16_verify3_over_ar": ratio("bfloat16", "auto", 3),
        "bf16_verify5_over_ar": ratio("bfloat16", "auto", 5),
        "fp32_aten_verify3_over_ar": ratio("float32", "aten", 3),
        "fp32_aten_verify5_over_ar": ratio("float32", "aten", 5),
        "bf16_aten_verify3_over_ar": ratio("bfloat16", "aten", 3),
        "bf16_aten_verify5_over_ar": ratio("bfloat16", "aten", 5),
        "fp32_t_ar_ms": round(1e3 * t[(("target", "float32", "auto"), 1)], 2),
        "fp32_aten_t_ar_ms": round(1e3 * t[(("target", "float32", "aten"), 1)], 2),
        "bf16_t_ar_ms": round(1e3 * t[(("target", "bfloat16", "auto"), 1)], 2),
        "bf16_aten_t_ar_ms": round(1e3 * t[(("target", "bfloat16", "aten"), 1)], 2),
        "draft_step_over_ar": round(
            t[(("draft", draft_dtype, "auto"), 1)] / t[(("target", target_dtype, "auto"), 1)], 4
        ),
        "fp32_kernels": f'"{models[("target", "float32", "auto")].kernel_choice.summary()}"',
        "bf16_kernels": f'"{models[("target", "bfloat16", "auto")].kernel_choice.summary()}"',
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

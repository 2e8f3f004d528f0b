"""The feature draft against the shipped layer draft, on the same target, prompts and run:
acceptance teacher-forced on the target's answers to the evaluation prompts, each draft's step
time against the target's AR step, and the bytes the features add to every verdict; with
``--network``, both pairs over loopback (sync DSD, an application delay each way), where the
feature draft waits for the prefill's features before its first block (its TTFT cost).

    python benchmarks/feature_draft.py [--eagle models/smollm2-eagle] [--layers models/smollm2-chat]
        [--prompts 40] [--network --rtt-ms 20 --network-prompts 8] [--sweep results/crossover] [--dtype auto]

Each model in the precision ``dtype = "auto"`` chooses for its pair on this CPU unless --dtype,
one thread, the main job's sampling (temperature 0.7, top-p 0.9), answers of at most 64 tokens.
The feature draft's acceptance differs by draft step (it runs on its own features after
the first): ``alpha_feature`` is the per-token alpha that gives the same expected tokens per
round at gamma 4 as its per-step acceptances do (``alpha_feature_step1..4``); the layer draft's
is the same at every step. Prints key=value lines; with ``--sweep`` (a main job's folder, or a
sweep's), also its feature sweep's ``sync_vs_ar`` crossover: measured with its 95% interval, and
predicted from the calibration points before the other points ran (``sync_vs_ar_predicted_ms``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig  # noqa: E402
from dsd.backends.machine import cpu_model  # noqa: E402
from dsd.backends.torch_lm import DTYPES, TorchLM, TorchLMConfig  # noqa: E402
from dsd.features import FEATURE_DTYPES, encoded_bytes  # noqa: E402
from dsd.analytic.latency_model import alpha_for_tokens_per_round, tokens_per_round_by_step  # noqa: E402
from dsd.costs.measurement import step_time_s  # noqa: E402
from orchestrator.records.suite_folder import sweep_crossovers  # noqa: E402

GAMMA, MAX_NEW_TOKENS, TEMPERATURE, TOP_P, SEED = 4, 64, 0.7, 0.9, 77


def model_dtypes(eagle_dir: Path, layers_dir: Path, dtype: str) -> dict[str, str]:
    """Each model's precision: the target's and the feature draft's as their pair resolves ``dtype``,
    the layer draft's as its own pair does."""
    eagle = HfBackendConfig(pair_path=str(eagle_dir), dtype=dtype)  # refuses what this CPU cannot run
    layers = HfBackendConfig(pair_path=str(layers_dir), dtype=dtype)
    return {"target": eagle.dtype, "feature": eagle.draft_dtype, "layers6": layers.draft_dtype}


def teacher_forced(eagle_dir: Path, layers_dir: Path, n_prompts: int, dtypes: dict[str, str]) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dsd.backends.eagle_model import load_eagle
    from dsd.backends.vocab_map import VocabMap
    from pairs import chat_data, chat_draft, eagle_draft, smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(eagle_dir))
    target = AutoModelForCausalLM.from_pretrained(str(eagle_dir / "target"), dtype=DTYPES[dtypes["target"]]).eval()
    prompts = Path(tempfile.mkdtemp()) / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in chat_data.read_prompts(smollm2.EVAL_PROMPTS)[:n_prompts])
    )
    config = chat_data.ChatDataConfig(
        prompts, samples_per_prompt=1, max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE, top_p=TOP_P, seed=SEED
    )
    answers = chat_data.answer_prompts(target, tokenizer, config)
    with torch.inference_mode():
        eagle = load_eagle(eagle_dir / "draft", DTYPES[dtypes["feature"]])
        feature = eagle_draft.heldout_acceptance(
            eagle, target, VocabMap.load(eagle_dir / "draft"), answers, GAMMA, TEMPERATURE, TOP_P, FEATURE_DTYPES
        )
        layers = AutoModelForCausalLM.from_pretrained(str(layers_dir / "draft"), dtype=DTYPES[dtypes["layers6"]]).eval()
        layers_vocab = VocabMap.load(layers_dir / "draft")
        sampled = chat_draft.heldout_acceptance(layers, target, layers_vocab, answers, TEMPERATURE, None, TOP_P)
        greedy = chat_draft.heldout_acceptance(layers, target, layers_vocab, answers, 1.0, 1, 1.0)
    out = {"answers": len(answers), "positions": sampled.positions}
    for dtype, a in feature.items():
        suffix = "" if dtype == "bfloat16" else f"_{dtype}"
        out[f"alpha_feature{suffix}"] = alpha_for_tokens_per_round(tokens_per_round_by_step(a.sampled), GAMMA)
        out[f"alpha_feature_greedy{suffix}"] = alpha_for_tokens_per_round(tokens_per_round_by_step(a.greedy), GAMMA)
        out[f"tokens_per_round_feature{suffix}"] = tokens_per_round_by_step(a.sampled)
        for k, (s, g) in enumerate(zip(a.sampled, a.greedy), 1):
            out[f"alpha_feature_step{k}{suffix}"] = s
            out[f"alpha_feature_greedy_step{k}{suffix}"] = g
    out["alpha_layers6"] = sampled.alpha_sampled
    out["alpha_layers6_greedy"] = greedy.alpha_greedy
    out["tokens_per_round_layers6"] = tokens_per_round_by_step([sampled.alpha_sampled] * GAMMA)
    return out


def step_times(eagle_dir: Path, layers_dir: Path, dtypes: dict[str, str], passes: int = 30) -> dict:
    """Medians of `passes` at a 100-token chat context, one thread: the target's AR step, the
    feature draft's step on its own feature and its first step after a verdict (three true
    features to catch up on), the layer draft's step."""
    from dsd.backends.eagle_lm import EagleLM
    from dsd.features import FeatureBlock

    torch.set_num_threads(1)
    target = TorchLM.load(TorchLMConfig(str(eagle_dir / "target"), dtypes["target"]))
    eagle = EagleLM.load(eagle_dir / "draft", dtypes["feature"])
    layers = TorchLM.load(TorchLMConfig(str(layers_dir / "draft"), dtypes["layers6"]))
    context = [(i * 31 + 11) % 49_000 for i in range(100)]
    t_ar_s = step_time_s(target, context, 1, passes)
    t_feature_s = step_time_s(eagle, context, 1, passes)
    t_layers_s = step_time_s(layers, context, 1, passes)
    features = torch.randn(len(context), eagle.feature_width)
    first_s = []
    for _ in range(passes):  # a verdict's 3 rows arrive, then the block's first token
        eagle.release("catch-up")
        eagle.add_features("catch-up", FeatureBlock(0, features[:-3]))
        eagle.logits("catch-up", context[:-2], 1)
        eagle.add_features("catch-up", FeatureBlock(len(context) - 3, features[-3:]))
        start_s = time.perf_counter()
        eagle.logits("catch-up", context + [5], 1)
        first_s.append(time.perf_counter() - start_s)
    return {
        "t_ar_ms": 1e3 * t_ar_s,
        "t_draft_feature_ms": 1e3 * t_feature_s,
        "t_draft_feature_first_ms": 1e3 * statistics.median(first_s),
        "t_draft_layers6_ms": 1e3 * t_layers_s,
        "t_draft_over_t_ar": t_feature_s / t_ar_s,
        "t_draft_over_t_ar_layers6": t_layers_s / t_ar_s,
    }


def network(eagle_dir: Path, layers_dir: Path, n_prompts: int, rtt_ms: float, dtypes: dict[str, str]) -> dict:
    """Sync DSD over loopback for each pair (its own verifier and edge), the same prompts:
    TTFT, time per token after the first, and acceptance S/(S+F) from rounds.csv."""
    from transformers import AutoTokenizer

    from pairs import chat_data, smollm2
    from services.launch import launch, post_runs, read_csv, wait_for_runs, wait_ready

    tokenizer = AutoTokenizer.from_pretrained(str(eagle_dir))
    prompts = [chat_data.render(tokenizer, p) for p in chat_data.read_prompts(smollm2.EVAL_PROMPTS)[:n_prompts]]
    logs = Path(tempfile.mkdtemp())
    out = {}
    for name, pair in (("feature", eagle_dir), ("layers6", layers_dir)):
        backend = json.dumps(
            {"kind": "hf", "pair_path": str(pair.resolve()), "dtype": dtypes["target"], "draft_dtype": dtypes[name]}
        )
        services = [
            launch("services.verifier", ["--backend-json", backend], logs),
            launch("services.edge", ["--backend-json", backend, "--out-dir", str(logs / f"edge-{name}")], logs),
        ]
        try:
            verifier, edge = [wait_ready(s, 300) for s in services]
            run = {
                "run_id": name,
                "client_id": name,
                "mode": "sync",
                "gamma": GAMMA,
                "prompts": prompts,
                "max_new_tokens": MAX_NEW_TOKENS,
                "verifier_url": verifier.url,
                "probe_count": 3,
                "temperature": TEMPERATURE,
                "top_p": TOP_P,
                "seed": SEED,
                "app_delay_ms": rtt_ms / 2,
            }
            summary = wait_for_runs(edge, post_runs(edge, [run]), timeout_s=3600)[name]
            if summary["status"] != "done":
                raise RuntimeError(f"{name}: {summary}")
            requests = read_csv(edge, name, "requests.csv")
            rounds = [r for r in read_csv(edge, name, "rounds.csv") if r["stale"] == "0"]
        finally:
            for s in services:
                s.terminate()
            for s in services:
                s.wait_or_kill()
        accepted = sum(int(r["accepted"]) for r in rounds)
        failed = sum(int(r["accepted"]) < int(r["proposed"]) for r in rounds)
        out[f"ttft_ms_{name}"] = 1e3 * statistics.median(float(r["ttft_s"]) for r in requests)
        out[f"per_token_ms_{name}"] = 1e3 * statistics.median(
            float(r["steady_per_token_s"]) for r in requests if r["steady_per_token_s"]
        )
        out[f"alpha_network_{name}"] = accepted / (accepted + failed)
        out[f"tokens_per_round_network_{name}"] = statistics.mean(int(r["emitted"]) for r in rounds)
        out[f"feature_bytes_per_round_{name}"] = statistics.mean(int(r["feature_bytes"]) for r in rounds)
    return out


def sync_crossover(folder: Path, pair: str) -> dict:
    """The feature sweep's sync DSD vs cloud AR crossover (ms), from the main job's summary."""
    row = sweep_crossovers(folder, pair).get("sync_vs_ar", {})
    return {
        "sync_vs_ar_ms": row.get("measured_rtt_ms", float("nan")),
        "sync_vs_ar_ci_low_ms": row.get("ci_low", float("nan")),
        "sync_vs_ar_ci_high_ms": row.get("ci_high", float("nan")),
        "sync_vs_ar_predicted_ms": row.get("predicted_rtt_ms_oos", float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eagle", type=Path, default=Path("models/smollm2-eagle"))
    parser.add_argument("--layers", type=Path, default=Path("models/smollm2-chat"))
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--network", action="store_true")
    parser.add_argument("--network-prompts", type=int, default=8)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--sweep", type=Path, help="a main job's output folder (results/crossover) or a sweep's")
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=(AUTO, *DTYPE_NAMES),
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    from pairs import smollm2

    for pair in (args.eagle, args.layers):
        smollm2.materialize_target(pair)
    manifest = json.loads((args.eagle / "manifest.json").read_text())
    width = manifest["features"]["width"]
    dtypes = model_dtypes(args.eagle, args.layers, args.dtype)
    results = teacher_forced(args.eagle, args.layers, args.prompts, dtypes)
    results.update(step_times(args.eagle, args.layers, dtypes))
    tokens = results["tokens_per_round_feature"]
    for dtype in FEATURE_DTYPES:
        suffix = "" if dtype == "bfloat16" else f"_{dtype}"
        header = encoded_bytes(0, width, dtype)  # one header a verdict, shared by its tokens
        results[f"feature_bytes_per_token{suffix}"] = header / tokens + encoded_bytes(1, width, dtype) - header
    if args.network:
        results.update(network(args.eagle, args.layers, args.network_prompts, args.rtt_ms, dtypes))
    if args.sweep is not None:
        results.update(sync_crossover(args.sweep, args.eagle.name))
    print(
        f"cpu={cpu_model()!r} threads=1 dtype={dtypes['target']} draft_dtype_feature={dtypes['feature']} "
        f"draft_dtype_layers6={dtypes['layers6']} gamma={GAMMA}"
    )
    for key, value in results.items():
        print(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")


if __name__ == "__main__":
    main()

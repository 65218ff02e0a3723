"""The peer stage, inside the image: vLLM on the same checkpoint and prompts as our engine (see
:mod:`bringup.peer` for the cases and the files).

Writes ``peer/report.json``: the stage header, ``engine`` (``vllm``), ``device``, ``near_tie_margin``,
``cases`` (per case: ``name``, ``model``, ``dtype``, ``prompts`` (the texts), ``max_tokens``, ``reference``
(our engine's tokens file, relative to the image's artifacts), ``runs``; the mla case also
``engine_report``, our engine's report on it) and ``problems``. Each run
(``name``, ``variant``, ``counts``: whether its divergences count against the image, ``settings``
with their reasons, ``tokens``, ``exit_code``, ``vllm``, ``packages``, ``load_s``, ``generate_s``,
``tokens_per_s``, ``prompt_tokens_equal``: prompts vLLM tokenized exactly as our engine,
``agreement``: counts per class against the reference, ``divergences``: the prompts that differ).

The stage fails when a counted run fails, tokenizes a prompt differently or diverges ``real``
from our engine; the ``defaults`` run (``peer.also_defaults``) is expected to diverge where a
workaround is needed, and is reported without counting.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from bringup.artifacts import FAILED, PASSED, read_json, write_json
from bringup.peer import settings as peer_settings
from bringup.stages.support.common import probe_versions, run_tee

E2E_REPORT, E2E_TOKENS = "e2e/report.json", "e2e/tokens.jsonl"
MLA_DTYPE = "bfloat16"
MLA_PROMPTS = 12  # the tiny key's first prompts: short, and text the byte vocabulary encodes
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def run(spec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    peer = spec.get("peer") or {}
    versions = probe_versions(sys.executable)
    e2e = read_json(out / E2E_REPORT)
    missing = _missing(peer, e2e, out, spec["image"])
    if missing:
        return FAILED, {"problems": [missing]}, versions
    folder = out / "peer"
    shutil.rmtree(folder, ignore_errors=True)
    margin = float(spec.get("near_tie_margin", 1.0))
    device = e2e["device"]
    prompts = [p["prompt"] for p in e2e["prompts"]]
    cases = [{"name": "e2e", "model": e2e["model"], "dtype": "bfloat16" if device == "cuda" else "float32",
              "prompts": prompts, "max_tokens": e2e["max_tokens"], "reference": E2E_TOKENS}]
    problems: list[str] = []
    if peer.get("mla_case"):
        mla = _mla_case(folder / "mla", device, spec["image"], problems)
        cases += [mla] if mla else []
    for case in cases:
        case["runs"] = []
        if not any((Path(case["model"]) / name).is_file() for name in TOKENIZER_FILES):
            problems.append(f"{case['name']}: {case['model']} has no {' or '.join(TOKENIZER_FILES)}, so vLLM cannot tokenize "
                            "the text prompts (a byte-level checkpoint gets one from engine.tiny.portable.make_portable)")
            continue
        config = json.loads((Path(case["model"]) / "config.json").read_text(encoding="utf-8"))
        every = peer_settings.settings(config, device, case["dtype"])
        variants = [peer_settings.WORKAROUNDS]
        # The defaults run shows what the workarounds fix where answers are known: the e2e model.
        # On random weights (mla) margins are a fraction of a logit, so any garbage reads near-tie.
        if peer.get("also_defaults") and case["name"] == "e2e" and any(s.workaround for s in every):
            variants.append(peer_settings.DEFAULTS)
        case["runs"] = [_vllm_run(case, peer_settings.for_variant(every, v), v, folder, out, margin, problems)
                        for v in variants]
    body = {"engine": peer.get("engine"), "device": device, "near_tie_margin": margin, "cases": cases, "problems": problems}
    for problem in problems:
        print(f"[peer] FAILED: {problem}", flush=True)
    return (FAILED if problems else PASSED), body, versions


def _missing(peer: dict, e2e: dict | None, out: Path, image: str) -> str | None:
    """Why the stage cannot start (no peer, no vLLM, no e2e run to compare with), or None."""
    if peer.get("engine") != "vllm":
        return f"the matrix gives image {image} no peer engine (peer: {{engine: vllm}})"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not importable in this image: the peer engine cannot run"
    if not e2e or not (out / E2E_TOKENS).is_file() or not e2e.get("prompts"):
        return f"no e2e run to compare with ({out / E2E_REPORT} or {out / E2E_TOKENS} missing): run invoke e2e --image {image}"
    return None


def _mla_case(folder: Path, device: str, image: str, problems: list[str]) -> dict | None:
    """Write the MLA-sizes checkpoint and run our engine on it (one rank) for the tiny key's
    first prompts; the case, or None."""
    from engine.tiny import answer_key

    key = answer_key.default()
    prompts, max_tokens = key.prompts[:MLA_PROMPTS], key.max_tokens
    checkpoint, prompt_file, engine_out = folder / "checkpoint", folder / "prompts.json", folder / "engine"
    log = folder / "engine.log"
    code = run_tee([sys.executable, "-m", "engine.tiny.random_checkpoint", "--out", str(checkpoint)], log)
    if code != 0:
        problems.append(f"mla case: writing the checkpoint failed (exit {code}; log {log})")
        return None
    write_json(prompt_file, {"prompts": prompts})
    code = run_tee([sys.executable, "-m", "engine.launch", "--world-size", "1", "--model", str(checkpoint), "--prompts",
                    str(prompt_file), "--max-tokens", str(max_tokens), "--dtype", MLA_DTYPE, "--device", device,
                    "--out", str(engine_out), "--image", image], log)
    if code != 0 or not (engine_out / "tokens.jsonl").is_file():
        problems.append(f"mla case: our engine failed (exit {code}; log {log})")
        return None
    return {"name": "mla", "model": str(checkpoint), "dtype": MLA_DTYPE, "prompts": prompts, "max_tokens": max_tokens,
            "reference": str((engine_out / "tokens.jsonl").relative_to(folder.parent.parent)),
            "engine_report": str((engine_out / "report.json").relative_to(folder.parent.parent))}


def _vllm_run(case: dict, applied: list, variant: str, folder: Path, out: Path, margin: float,
              problems: list[str]) -> dict[str, Any]:
    """One vLLM run of ``case`` with the ``applied`` settings (of ``variant``), compared with the
    case's reference tokens."""
    name = "vllm" if variant == peer_settings.WORKAROUNDS else f"vllm-{variant}"
    run_dir = folder / case["name"] / name
    counts = variant == peer_settings.WORKAROUNDS
    prompts = case["prompts"]
    request = {"case": case["name"], "variant": variant, "model": case["model"], "prompts": prompts,
               "max_tokens": case["max_tokens"], "settings": [s.as_json() for s in applied],
               "llm_kwargs": peer_settings.llm_kwargs(applied), "out": str(run_dir)}
    request_file = run_dir / "request.json"
    write_json(request_file, request)
    env = {**os.environ, **peer_settings.environment(applied)}
    print(f"[peer] {case['name']}/{name}: vllm with {', '.join(f'{s.key}={s.value}' for s in applied)}", flush=True)
    code = run_tee([sys.executable, "-m", "bringup.peer.vllm_run", str(request_file)], run_dir / "run.log", env=env)
    record = read_json(run_dir / "run.json") or {}
    result = {"name": name, "variant": variant, "counts": counts, "settings": request["settings"], "exit_code": code,
              "tokens": str((run_dir / "tokens.jsonl").relative_to(out)),
              **{k: record.get(k) for k in ("vllm", "torch", "packages", "load_s", "generate_s", "tokens_per_s")}}
    if code != 0 or not record:
        result["tokens"] = None
        if counts:
            problems.append(f"{case['name']}/{name}: vLLM failed (exit {code}; log {run_dir / 'run.log'})")
        return result
    result.update(_agreement(case, run_dir, out, margin))
    if counts:
        if result["prompt_tokens_equal"] < len(prompts):
            problems.append(f"{case['name']}/{name}: vLLM tokenized {len(prompts) - result['prompt_tokens_equal']} prompt(s) "
                            "differently from our engine (see run.json)")
        real = [d for d in result["divergences"] if d["status"] == "real"]
        if real:
            problems.append(f"{case['name']}/{name}: {len(real)} of {len(prompts)} prompts diverge from our engine for real "
                            f"(first: prompt {real[0]['prompt_index']} at token {real[0]['position']})")
    return result


def _agreement(case: dict, run_dir: Path, out: Path, margin: float) -> dict[str, Any]:
    """The run's tokens against the reference's: counts per class, the divergences, and how many
    prompts vLLM tokenized as our engine does."""
    from bringup.diff.tokens import IDENTICAL, compare_generations, read_generations

    rows = compare_generations(read_generations(out / case["reference"]), read_generations(run_dir / "tokens.jsonl"), margin)
    agreement: dict[str, int] = {}
    for row in rows:
        agreement[row.status] = agreement.get(row.status, 0) + 1
    divergences = [{"prompt_index": r.prompt_index, "status": r.status, "position": r.position, "margin": r.margin,
                    "engine_token": r.reference_token, "peer_token": r.token, "detail": r.detail}
                   for r in rows if r.status != IDENTICAL]
    return {"agreement": agreement, "divergences": divergences,
            "prompt_tokens_equal": _same_prompt_tokens(case["model"], run_dir / "tokens.jsonl")}


def _same_prompt_tokens(model: str, tokens_file: Path) -> int:
    """How many prompts vLLM encoded to the same ids as our engine's tokenizer."""
    from engine.config import ModelConfig
    from engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model, ModelConfig.from_dir(model))
    lines = [json.loads(line) for line in tokens_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sum(tokenizer.encode(line["prompt"]) == line["prompt_token_ids"] for line in lines)

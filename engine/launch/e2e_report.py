"""The e2e artifacts of a launch: ``report.json`` and ``tokens.jsonl`` (written atomically).

``tokens.jsonl``: one line per (rank, prompt): ``rank``, ``prompt_index``, ``prompt``,
``token_ids``, ``logprobs``, ``top2_margin`` (and ``text``, ``finish_reason``).

``report.json`` (``"schema": 1``): the stage header (``stage``, ``image``, ``run_id``, ``status``,
``started``, ``ended``, ``versions``), ``exit_code``, ``reason``, ``world_size``, ``device``,
``backend``, ``model``, ``max_tokens``, ``ops`` (rank 0's ``bringup_kernels.report()``: each op's backend
and every fallback) and ``ops_differ`` (ranks whose report differs), ``op_calls`` (per op, the calls
each backend ran, summed over the ranks; ``{}``: the op never ran), ``native``, ``cuda_graphs`` (rank 0's captured
decode batch sizes, None when eager), ``env`` (the rank
settings and whether the launcher set them), ``quirks``, ``consistent`` (every prompt gave one
sequence on all ranks), ``answers`` (the answer-key score, None without a key), ``timings``,
``unserved`` (ops set to a backend other than the default that served none of their calls: see
:func:`unserved_requests`), ``ranks`` (pid, exit, state at the end, heartbeat), ``failure`` (the blamed rank, why, the last
lines of its traceback and log), ``tracebacks`` (every traceback found in the rank logs) and
``prompts``: per prompt ``index``, ``prompt``, ``sequences`` (each distinct ``token_ids`` with its
``text`` and the ``ranks`` that produced it), ``answer_ok`` (None when not keyed or not run),
``expected``, ``ttft_s`` and ``decode_tok_s`` (lists by rank, None where a rank has no result).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.files import to_json, write_text

SCHEMA = 1
TRACEBACK_HEADER = "Traceback (most recent call last):"
TRACEBACK_LINES = 40
LOG_TAIL_LINES = 20


def tracebacks_in(text: str) -> list[list[str]]:
    """Every Python traceback in a log: its lines from the header through the exception message
    (a prefix before the header, such as ``[rank1]:``, is stripped from each of its lines)."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        at = lines[i].find(TRACEBACK_HEADER)
        if at < 0:
            i += 1
            continue
        prefix = lines[i][:at]
        block = [TRACEBACK_HEADER]
        i += 1
        while i < len(lines) and lines[i].startswith(prefix) and lines[i][len(prefix):].startswith(" "):
            block.append(lines[i][len(prefix):])
            i += 1
        # The exception line(s): up to a blank line or the next traceback.
        while i < len(lines) and lines[i].startswith(prefix) and lines[i][len(prefix):].strip() and TRACEBACK_HEADER not in lines[i]:
            block.append(lines[i][len(prefix):])
            i += 1
        found.append(block)
    return found


def log_tail(text: str, n: int = LOG_TAIL_LINES) -> list[str]:
    return text.splitlines()[-n:]


def read_log(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _prompt_entry(index: int, prompt: str, results: dict[int, dict], world_size: int, key) -> dict:
    groups: dict[tuple, dict] = {}
    ttft, rate = [None] * world_size, [None] * world_size
    for rank in sorted(results):
        out = results[rank]["outputs"][index]
        group = groups.setdefault(tuple(out["token_ids"]), {"token_ids": out["token_ids"], "text": out["text"], "ranks": []})
        group["ranks"].append(rank)
        ttft[rank], rate[rank] = out["ttft_s"], out["decode_tok_s"]
    sequences = sorted(groups.values(), key=lambda g: (-len(g["ranks"]), g["ranks"][0]))
    expected, answer_ok = None, None
    if key is not None and prompt in key.prompts:
        expected = key.answer(prompt)
        answer_ok = all(key.check(prompt, g["text"]) for g in sequences) if sequences else None
    return {"index": index, "prompt": prompt, "sequences": sequences, "answer_ok": answer_ok, "expected": expected,
            "ttft_s": ttft, "decode_tok_s": rate}


def summed_calls(results: dict[int, dict]) -> dict[str, dict[str, int]]:
    """Per op, the calls each backend ran on all ranks together (each rank's ``ops.calls``)."""
    total: dict[str, dict[str, int]] = {}
    for result in results.values():
        for op, calls in (result["ops"].get("calls") or {}).items():
            into = total.setdefault(op, {})
            for backend, n in calls.items():
                into[backend] = into.get(backend, 0) + n
    return dict(sorted(total.items()))


def unserved_requests(ops: dict | None, calls: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """The ops asked for a backend of their own (rank 0's ``ops``: requested other than the backend
    every op gets, ``ENGINE_OPS_BACKEND`` or the default) that served none of their calls on any
    rank (``calls``: :func:`summed_calls`): ``op``, ``requested``, ``calls`` (per backend that ran
    them instead; ``{}``: the op never ran) and ``why``. A run that answered right did not
    exercise these backends."""
    everyone = ops.get("global_backend", ops.get("default_backend")) if ops else None
    if everyone is None:
        return []
    declined: dict[str, list[str]] = {}
    for entry in ops.get("call_fallbacks", []):
        reasons = declined.setdefault(entry["op"], [])
        if entry["reason"] not in reasons:
            reasons.append(entry["reason"])
    found = []
    for op, entry in ops["ops"].items():
        requested, ran = entry["requested"], calls.get(op, {})
        if requested == everyone or ran.get(requested):
            continue
        if not ran:
            why = "the op never ran"
        elif entry["backend"] != requested:
            why = f"{requested} unavailable: {entry['reason']}"
        else:
            why = f"{requested} declined every call: " + "; ".join(declined.get(op, ["(no reason recorded)"]))
        found.append({"op": op, "requested": requested, "calls": dict(ran), "why": why})
    return found


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def build(*, header: dict[str, Any], launch: dict[str, Any], prompts: list[str], results: dict[int, dict],
          logs: dict[int, Path], failure: dict[str, Any] | None, key=None) -> tuple[dict, list[dict]]:
    """The report and the token lines of one launch.

    ``header``: the stage header fields; ``launch``: ``exit_code``, ``reason``, ``world_size``,
    ``device``, ``model``, ``max_tokens``, ``env``, ``quirks``, ``ranks``, ``wall_s``;
    ``results``: each finished rank's result (see :func:`engine.launch.worker.run_rank`);
    ``logs``: each rank's log file; ``failure``: ``{"rank", "reason"}`` or None; ``key``: the
    model's :class:`engine.tiny.answer_key.AnswerKey` or None. A launch whose ranks all finished
    but disagree, or miss an answer of the key, gets exit code 3.
    """
    world_size = launch["world_size"]
    entries = [_prompt_entry(i, p, results, world_size, key) for i, p in enumerate(prompts)]
    complete = len(results) == world_size
    consistent = complete and all(len(e["sequences"]) == 1 for e in entries)
    keyed = [e for e in entries if e["answer_ok"] is not None]
    answers = None
    if key is not None:
        answers = {"scored": len(keyed), "correct": sum(e["answer_ok"] for e in keyed),
                   "accuracy": sum(e["answer_ok"] for e in keyed) / len(keyed) if keyed else None}
    exit_code = launch["exit_code"]
    if exit_code == 0 and (not consistent or any(not e["answer_ok"] for e in keyed)):
        exit_code = 3
        launch = {**launch, "reason": "ranks disagree on some prompt" if not consistent else "wrong answers (see answers)"}

    tracebacks = []
    texts = {rank: read_log(path) for rank, path in sorted(logs.items())}
    for rank, text in texts.items():
        tracebacks += [{"rank": rank, "log": logs[rank].name, "lines": tb[-TRACEBACK_LINES:]} for tb in tracebacks_in(text)]
    if failure is not None:
        rank = failure.get("rank")
        own = [t["lines"] for t in tracebacks if t["rank"] == rank]
        failure = {**failure, "traceback": own[-1] if own else None, "log_tail": log_tail(texts.get(rank, "")) if rank is not None else None}

    first = results[min(results)] if results else None
    calls = summed_calls(results)
    ops_differ = sorted(r for r, res in results.items() if first is not None and res["ops"]["ops"] != first["ops"]["ops"])
    timings = {
        "wall_s": launch["wall_s"],
        "load_s": max((r["load_s"] for r in results.values()), default=None),
        "generate_s": max((r["generate_s"] for r in results.values()), default=None),
        "ttft_s_mean": _mean([v for e in entries for v in e["ttft_s"]]),
        "decode_tok_s_mean": _mean([v for e in entries for v in e["decode_tok_s"]]),
    }
    report = {
        "schema": SCHEMA, **header, "status": "passed" if exit_code == 0 else "failed",
        "exit_code": exit_code, "reason": launch["reason"], "world_size": world_size, "device": launch["device"],
        "backend": first["backend"] if first else None, "model": launch["model"], "max_tokens": launch["max_tokens"],
        "versions": first["versions"] if first else None, "ops": first["ops"] if first else None, "ops_differ": ops_differ,
        "op_calls": calls, "unserved": unserved_requests(first["ops"] if first else None, calls),
        "native": first["native"] if first else None, "cuda_graphs": first.get("cuda_graphs") if first else None, "env": launch["env"], "quirks": launch["quirks"],
        "consistent": consistent, "answers": answers, "timings": timings, "ranks": launch["ranks"],
        "failure": failure, "tracebacks": tracebacks, "prompts": entries,
    }
    tokens = [{"rank": rank, "prompt_index": out["prompt_index"], "prompt": out["prompt"], "token_ids": out["token_ids"],
               "logprobs": out["logprobs"], "top2_margin": out["top2_margin"], "text": out["text"],
               "finish_reason": out["finish_reason"]}
              for rank in sorted(results) for out in results[rank]["outputs"]]
    return report, tokens


def write(out: Path, report: dict, tokens: list[dict]) -> None:
    """``out/report.json`` and ``out/tokens.jsonl``, each written atomically."""
    write_text(out / "tokens.jsonl", "".join(to_json(t) + "\n" for t in tokens))
    write_text(out / "report.json", to_json(report, indent=1) + "\n")

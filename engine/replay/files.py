"""A replay's files in its folder, written atomically, and read back with errors naming the file.

    replay.jsonl         one line per prompt: prompt_index, prompt, token_ids (the forced tokens),
                         logprobs (of each forced token), top_ids and top_logprobs (top-5 per position)
    hidden.safetensors   "p<prompt index>.l<layer>": [kept positions, hidden] float32
    report.json          the run: settings, model, device, dtype, the reference tokens replayed
                         (image, file, sha256), ops (bringup_kernels.report()), versions, timings

Hidden states are bounded: :func:`check_size` refuses settings whose file would exceed
:data:`MAX_HIDDEN_BYTES` before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.files import JsonFileError, load_jsonl_objects, read_json, to_json, write_bytes, write_text

from . import PromptReplay

TOKENS, HIDDEN, REPORT = "replay.jsonl", "hidden.safetensors", "report.json"
MAX_HIDDEN_BYTES = 512 << 20


class ReplayFileError(ValueError):
    """A replay folder cannot be used; the message names the file and what is wrong."""


@dataclass
class Replay:
    """A replay read back: its report and its prompts by index."""

    folder: Path
    report: dict[str, Any]
    prompts: dict[int, PromptReplay] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        return str(self.report.get("dtype"))


def hidden_bytes(prompts: int, positions: int, layers: int, hidden_size: int) -> int:
    return prompts * positions * layers * hidden_size * 4


def check_size(prompts: int, positions: int, layers: int, hidden_size: int) -> None:
    """ValueError naming the settings when the hidden states would not fit :data:`MAX_HIDDEN_BYTES`."""
    size = hidden_bytes(prompts, positions, layers, hidden_size)
    if size > MAX_HIDDEN_BYTES:
        raise ValueError(f"replay hidden states of {prompts} prompts x {positions} positions x {layers} layers x {hidden_size} "
                         f"would take {size / 2**20:.0f} MiB (limit {MAX_HIDDEN_BYTES >> 20} MiB): lower positions, "
                         f"prompts or the layers kept")


def write(folder: Path, replays: list[PromptReplay], report: dict[str, Any]) -> None:
    """The three files of the module docstring, each atomically (report.json last)."""
    from safetensors.torch import save

    lines = [to_json({"prompt_index": r.prompt_index, "prompt": r.prompt, "token_ids": r.token_ids, "logprobs": r.logprobs,
                      "top_ids": r.top_ids, "top_logprobs": r.top_logprobs}) for r in replays]
    write_text(folder / TOKENS, "".join(line + "\n" for line in lines))
    tensors = {f"p{r.prompt_index}.l{layer}": h.contiguous() for r in replays for layer, h in r.hidden.items()}
    write_bytes(folder / HIDDEN, save(tensors))
    write_text(folder / REPORT, to_json(report, indent=1) + "\n")


def read(folder: Path) -> Replay:
    """The replay in ``folder``; ReplayFileError naming the file that is missing or broken."""
    folder = Path(folder)
    report = read_json(folder / REPORT)
    if report is None:
        raise ReplayFileError(f"{folder / REPORT}: missing or not a JSON object (made by python -m engine.replay)")
    replay = Replay(folder, report)
    try:
        objects = load_jsonl_objects(folder / TOKENS)
    except JsonFileError as exc:
        raise ReplayFileError(str(exc)) from None
    for where, obj in objects:
        entry = _entry(where, obj)
        replay.prompts[entry.prompt_index] = entry
    _read_hidden(folder / HIDDEN, replay)
    return replay


def _entry(where: str, obj: dict) -> PromptReplay:
    for key, kind in (("prompt_index", int), ("prompt", str), ("token_ids", list), ("logprobs", list), ("top_ids", list),
                      ("top_logprobs", list)):
        if not isinstance(obj.get(key), kind):
            raise ReplayFileError(f"{where}: '{key}' must be a {kind.__name__}")
    n = len(obj["token_ids"])
    if any(len(obj[key]) != n for key in ("logprobs", "top_ids", "top_logprobs")):
        raise ReplayFileError(f"{where}: logprobs, top_ids and top_logprobs need one entry per token ({n})")
    logprobs = [float("nan") if v is None else float(v) for v in obj["logprobs"]]  # strict JSON writes NaN as null
    return PromptReplay(obj["prompt_index"], obj["prompt"], obj["token_ids"], logprobs, obj["top_ids"], obj["top_logprobs"])


def _read_hidden(path: Path, replay: Replay) -> None:
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - any loader failure means the file is unusable
        raise ReplayFileError(f"{path}: not a readable safetensors file ({exc})") from None
    for key, tensor in tensors.items():
        prompt, _, layer = key.partition(".")
        try:
            index, layer_index = int(prompt[1:]), int(layer[1:])
        except ValueError:
            raise ReplayFileError(f"{path}: unexpected tensor {key!r} (expected p<prompt>.l<layer>)") from None
        if index not in replay.prompts:
            raise ReplayFileError(f"{path}: tensor {key!r} for prompt {index}, which {replay.folder / TOKENS} lacks")
        replay.prompts[index].hidden[layer_index] = tensor.float()

"""The peer engine: vLLM on the same checkpoint and prompts as our engine, for a cross-engine diff.

The peer stage (:mod:`bringup.stages.peer`, inside the image, after e2e) runs one or two cases:

* ``e2e``: the model, prompts, token budget and device the image's e2e stage used (read from
  ``e2e/report.json``); its reference is our engine's ``e2e/tokens.jsonl``.
* ``mla`` (``peer.mla_case``): a random-weight checkpoint with DeepSeek-V3's real MLA sizes
  (:mod:`engine.tiny.random_checkpoint`), so vLLM's MLA backend is compared with ours; both
  engines run it in bfloat16, one engine rank each.

Per case, vLLM runs with the settings of :mod:`.settings` (each one recorded with its reason),
and with ``peer.also_defaults`` once more without the correctness workarounds, to show what
they fix (the e2e case only: on random weights every margin is a fraction of a logit, so a
wrong token cannot be told from a rounding flip there). ``python -m bringup.peer.vllm_run`` runs vLLM in a process of its own.

Files under ``artifacts/<image>/peer/``:

    report.json                      the stage record: header, engine, cases (see bringup.stages.peer)
    <case>/<run>/tokens.jsonl        the e2e tokens schema (rank 0): token_ids, logprobs, top2_margin, text
    <case>/<run>/run.json            settings applied, versions, timings, prompt token ids
    <case>/<run>/run.log             the run's output
    mla/checkpoint/, mla/prompts.json, mla/engine/   the mla case's model, prompts and our engine's run
"""

"""Launch N ranks of the engine with expert parallelism and write the e2e artifacts.

    python -m engine.launch --out DIR [--world-size N] [--model DIR] [--prompts FILE] [--answer-key FILE] [--max-tokens N]
                            [--device auto|cpu|cuda] [--dtype float32|bfloat16] [--ignore-eos]
                            [--timeout S] [--hang-timeout S] [--enforce-eager] [--image NAME]
                            [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT [--nproc-per-node M]]

Every rank generates every prompt greedily (attention is data-parallel: each rank serves its
own copy of the requests; the routed experts are split across the ranks, see
:mod:`engine.parallel`), so the report can tell whether all ranks produced the same tokens.
Defaults: world size = the number of GPUs, or 8 gloo ranks on CPU; the model is the bundled
tiny checkpoint; the prompts and the token budget come from the answer key (``--answer-key``,
else the model's ``answer_key.json``; without one, ``--prompts`` is needed and nothing is scored).

Three ways to run, one report:

* one host (the default, :mod:`.local`): the launcher starts the ranks itself
  (:mod:`.supervisor`); a rank that dies or raises, a hang (heartbeat watchdog), ``--timeout``,
  SIGINT or SIGTERM stop every rank, and the report names the rank to blame with the end of its
  traceback;
* one node of several (``--nnodes``, :mod:`.torchrun_node`): the launcher runs torchrun's agent
  for this node (c10d rendezvous at ``--rdzv-endpoint``) and watches its ranks for hangs;
* a rank started by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` in the
  environment, :mod:`.torchrun_rank`): the ranks send their results over the process group to
  node 0, which writes the report; torchrun handles failures.

Writes ``DIR/rank<i>.log``, ``DIR/tokens.jsonl`` and ``DIR/report.json`` (see
:mod:`engine.launch.e2e_report`). Exit status: 0 all ranks agree (and answer correctly, with a key);
1 a rank failed or hung; 2 unusable arguments; 3 ranks disagree or answers are wrong; 124
timeout; 130 SIGINT; 143 SIGTERM.
"""

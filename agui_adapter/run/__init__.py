"""One AG-UI run, from admission to its last event, and the conversation the runs make up.

Why a package: a run is a pure state machine carried out by a driver that does the I/O.

* The machine (sans-I/O): ``machine`` (the core: inputs, the one place that sets the phase,
  emission), ``transitions`` (the phases and their legal moves, as tables), ``context`` (what
  the run knows), the decisions it takes (``stream_end``, ``resume_steps``) and its pure
  helpers (``identity``, ``answers``, ``resume_replies``, ``endings``, ``pipeline_state``,
  ``task_lost``), the values it exchanges with the driver (``effects``) and the one loop that
  feeds replies back to it (``loop``).
* The mapping (sans-I/O): ``translation`` (A2A frames to AG-UI events, with the run's ``usage``
  totals), ``reconcile`` (an adopted run's translator catching up), ``interrupts``,
  ``resume``, ``pipeline_progress``, ``outbound`` (the messages sent to the kernel),
  ``process_gone`` (the ending of a run whose process died) and ``history`` (a thread's
  conversation as AG-UI messages, with the ids its runs streamed).
* The I/O: ``driver`` (with its attach ``lifecycle``, the ``detached`` loop and the narrow
  ``services`` it is given), ``pump`` (the kernel reader thread), and the engine, a facade
  over one module per job (``admission``, ``admitted``, ``slots``, ``registry``,
  ``reattach``, ``shutdown``, ``cancel``), with ``adoption`` (runs whose process is gone,
  taken over by this one).
"""

"""One AG-UI run, from admission to its last event.

Why a package: a run is a pure state machine (``machine``, exchanging the values of
``effects`` with its driver) carried out by a driver that does the I/O (``driver``), fed by a
kernel reader thread (``pump``), with the A2A-to-AG-UI mapping (``translation``), Resume
rules (``resume``), interrupts (``interrupts``), pipeline progress (``pipeline_progress``),
the messages sent to the kernel (``outbound``), admission and the cancel extension
(``engine``), and runs whose process is gone, taken over by this one (``adoption``).
"""

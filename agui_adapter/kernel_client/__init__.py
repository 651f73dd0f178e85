"""The adapter's side of the A2A kernel: the client, and the kernel process.

Why a package: everything that talks to or manages the kernel: JSON-RPC over HTTP and the
frame reader (``a2a``, ``sse``), what each call reports and carries (``calls``), choosing and
launching the kernel (``launch``) and the lifeline that stops a kernel child with the adapter
(``lifeline``, also run as a script).
"""

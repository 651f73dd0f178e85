"""agui-adapter: the synchronous AG-UI front door for the iac-code A2A kernel.

The package is organised in layers, one folder each (README: "a map of the package"):
``http`` (the built-in HTTP/1.1 server), ``web`` (the WSGI app), ``protocol`` (the AG-UI side,
sans-I/O), ``run`` (one run: machine, driver, translation), ``state`` (what lasts on disk),
``kernel_client`` (the A2A client and the kernel process), ``ops`` (metrics, logs, tracing,
service manager) and ``scripted_kernel`` (the embedded kernel, which imports nothing of the
adapter). ``cli`` and ``wsgi`` are the two ways in; ``config`` their settings.
"""

__version__ = "0.1.0"

#: The AG-UI protocol version this adapter speaks.
PROTOCOL_VERSION = "1.0"

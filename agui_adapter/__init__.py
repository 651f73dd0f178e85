"""agui-adapter: the synchronous AG-UI front door for the iac-code A2A kernel.

The package is organised in layers (see README): a sans-I/O protocol core
(`validation`, `content`, `translate`, `events`, `sse`, `i18n`), thin I/O edges
(`web`, `a2a`, `store`), and one orchestration module (`runs`) that knows the
order of things.
"""

__version__ = "0.1.0"

#: The AG-UI protocol version this adapter speaks.
PROTOCOL_VERSION = "1.0"

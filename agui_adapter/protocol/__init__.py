"""The AG-UI side of the adapter, with no I/O.

Why a package: what the contract says, as plain functions and values that tests call
directly: the envelope's validation and its compiled fast path (``validation``,
``fastschema``, the JSON Schemas in ``schemas/``), user content and images (``content``,
``decode_budget``), AG-UI events and their SSE encoding (``events``), error codes
(``errors``), every user-visible message (``catalog``) and its translations (``i18n``,
``locales/``), and the timestamps they carry (``timestamps``).
"""

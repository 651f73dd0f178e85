"""What lasts on disk: thread records, run journals, retention, workspaces.

Why a package: durable state has one set of rules (atomic replace, fsync before announcing,
mode 0600 in 0700 directories, no secret ever written) and they live together: the thread
record and its named mutations (``record``, sans-I/O), the files and OS locks that hold it
(``store``), the journals a run's readers follow (``journal``), pruning (``retention``) and the
workspace a run may use (``workspace``).
"""

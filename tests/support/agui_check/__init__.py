"""The project's official-client checker: AG-UI SSE streams replayed through ``@ag-ui/client``."""

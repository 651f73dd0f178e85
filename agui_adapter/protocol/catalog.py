"""Every user-visible English message the adapter can produce, in one place.

Messages are templates (``str.format`` placeholders in braces). They are the keys of
the translation catalogs in ``locales/<lang>.json``; ``i18n.translate`` looks them up
per request. Keeping them here (and only here) lets a test prove that every message
exists in every supported language with the same placeholders.
"""

from __future__ import annotations

# --- HTTP edge -------------------------------------------------------------------
UNAUTHORIZED = "A valid bearer token is required."
UNSUPPORTED_MEDIA_TYPE = "Content-Type must be application/json."
NOT_ACCEPTABLE = "The client must accept text/event-stream responses."
BODY_TOO_LARGE = "The AG-UI request body is too large (at most {limit} bytes)."
CANCEL_BODY_TOO_LARGE = "The cancel request body is too large (at most {limit} bytes)."
INVALID_JSON = "The request body is not valid JSON."
CANCEL_INVALID_JSON = "The cancel request body is not valid JSON."
NOT_AN_OBJECT = "RunAgentInput must be a JSON object."
CANCEL_NOT_AN_OBJECT = "The cancel request must be a JSON object."
CANCEL_FIELDS_REQUIRED = "threadId and rosInvocationId are required."
THREAD_HEADER_MISMATCH = "The X-AGUI-Thread-Id header must equal the body's threadId."
NOT_FOUND = "No such endpoint."
METHOD_NOT_ALLOWED = "This method is not allowed on this endpoint."
INTERNAL_ERROR = "The AG-UI adapter failed unexpectedly."
KERNEL_NOT_READY = "The execution kernel is not ready."

# --- field validation (RunAgentInput envelope and forwardedProps.iacCode) ----------
FIELD_REQUIRED = "{field} is required."
FIELD_UNKNOWN = "{field} is not a supported field."
FIELD_STRING = "{field} must be a string."
FIELD_OBJECT = "{field} must be an object."
FIELD_ARRAY = "{field} must be an array."
FIELD_BOOLEAN = "{field} must be a boolean."
FIELD_INTEGER = "{field} must be an integer."
FIELD_NOT_EMPTY = "{field} must not be empty."
FIELD_TOO_LONG = "{field} must be at most {limit} characters long."
FIELD_MINIMUM = "{field} must be at least {limit}."
FIELD_MAXIMUM = "{field} must be at most {limit}."
FIELD_NOT_UNICODE = "{field} must be valid Unicode text (it contains a lone UTF-16 surrogate)."
FIELD_TOO_DEEP = "{field} is nested too deeply (at most {limit} levels)."
FIELD_ENUM = "{field} must be one of: {allowed}."
FIELD_CONST = "{field} must be {value}."
FIELD_INVALID = "{field} is invalid."
TOOLS_NOT_SUPPORTED = "Client-provided tools are not supported; tools must be an empty array."

# --- user content -----------------------------------------------------------------
USER_MESSAGE_REQUIRED = "A new run requires a user message."
CONTENT_INVALID = "The user message content is invalid."
PART_TYPE_UNSUPPORTED = "{part} content is not supported; only text and inline data images are."
REMOTE_MEDIA_UNSUPPORTED = "Remote media URLs are not supported; send the image inline as base64 data."
IMAGE_TYPE_UNSUPPORTED = "The image media type {mimeType} is not supported (use PNG, JPEG, GIF or WebP)."
IMAGE_NOT_BASE64 = "The image data is not valid base64."
IMAGE_TYPE_MISMATCH = "The image data is not a {mimeType} image."
IMAGE_INVALID = "The image data is invalid."
IMAGE_TOO_LARGE = "An image exceeds the maximum size of {limit} MiB."
IMAGE_TOO_MANY_PIXELS = "An image exceeds the maximum of {limit} megapixels."
IMAGES_TOO_LARGE = "The total image content exceeds the maximum size of {limit} MiB."
IMAGE_NEEDS_RESIZE = (
    "An image is larger than the kernel's {limit} MiB limit; install the adapter's "
    "'images' extra (Pillow) to shrink such images automatically."
)

# --- workspace (cwd) ----------------------------------------------------------------
CWD_NOT_ABSOLUTE = "The iac-code workspace ({field}) must be an absolute path."
CWD_INVALID = "The iac-code workspace ({field}) is invalid."
CWD_NOT_DIRECTORY = "The iac-code workspace ({field}) is not a directory."
CWD_OUTSIDE_ROOTS = "The iac-code workspace ({field}) is outside the allowed roots."
CWD_CANNOT_CREATE = "The iac-code workspace ({field}) cannot be created."
CWD_STATE_DIR = "forwardedProps.iacCode.cwd must not be the adapter's state directory, lie inside it or contain it."

# --- admission -------------------------------------------------------------------
DUPLICATE_RUN_ID = "The AG-UI run id has already been used for this same request."
RUN_ID_CONFLICT = "The AG-UI run id has already been used for a different request."
THREAD_BUSY = "The AG-UI thread already has an active run."
THREAD_BINDING_CONFLICT = "The AG-UI thread is already bound to another workspace or caller."
RESUME_REQUIRED = "The AG-UI thread is waiting for interrupt responses."
EXECUTION_LOST_NO_THREAD = "The execution to resume is no longer available."
EXECUTION_LOST_MISMATCH = "The resume request does not match the interrupted run."
STATE_UNAVAILABLE = "The AG-UI adapter state is unavailable."
SERVER_BUSY = "The AG-UI adapter is running as many runs as it allows; retry in {seconds} seconds."
IMAGE_DECODE_BUSY = "The AG-UI adapter is decoding as many images as it allows; retry in {seconds} seconds."

# --- run errors --------------------------------------------------------------------
A2A_UNAVAILABLE = "The local A2A execution service is unavailable."
A2A_EXECUTION_FAILED = "The A2A execution failed."
A2A_EXECUTION_FAILED_DETAIL = "The A2A execution failed: {detail}"
A2A_REJECTED = "The A2A execution service rejected the request: {detail}"
A2A_MALFORMED = "The A2A execution service sent a malformed response."
CANCELLED = "The execution was cancelled."
SHUTTING_DOWN = "The AG-UI adapter is shutting down; the execution was cancelled."
CLIENT_GONE = "The client went away; the execution was cancelled."
NOBODY_REATTACHED = "No client reattached to the run in time; the execution was cancelled."
RUN_PROCESS_GONE = "The adapter process running this run stopped; the run's outcome is unknown."
TASK_IDENTITY_CHANGED = "The A2A task identity changed unexpectedly."
CONTEXT_IDENTITY_CHANGED = "The A2A context identity changed unexpectedly."
MAPPING_NOT_COMMITTED = "The execution mapping could not be committed."
SESSION_MAPPING_NOT_COMMITTED = "The execution session mapping could not be committed."

# --- interrupts and resume ----------------------------------------------------------
PERMISSION_REQUIRED = "Permission required"
INPUT_REQUIRED = "Input required"
INTERRUPT_NOT_COMMITTED = "The interrupted execution state could not be committed."
ANSWER_NOT_COMMITTED = "The accepted interrupt response could not be committed."
INTERRUPT_OTHER_TASK = "An interrupt belongs to another A2A task."
INTERRUPT_OTHER_CONTEXT = "An interrupt belongs to another A2A context."
RESUME_DUPLICATE_IDS = "The resume contains duplicate interrupt ids: {ids}."
RESUME_INCOMPLETE = "The resume must answer every pending interrupt exactly once; missing: {ids}."
RESUME_UNKNOWN = "The resume references an unknown interrupt: {ids}."
RESUME_PAYLOAD_MISSING = "The resolved interrupt {id} requires a payload."
RESUME_PAYLOAD_INVALID = "The response to interrupt {id} is invalid: {reason}"
RESUME_NO_ANSWER = "The response to interrupt {id} does not contain an answer."
RESUME_ALREADY_APPLIED = "The interrupt response has already been applied."
RESUME_TASK_UNAVAILABLE = "The A2A task to resume is unavailable."
RESUME_SESSION_UNAVAILABLE = "The iac-code session to resume is unavailable."
SESSION_LOST = "The iac-code session of this thread is no longer available; the next run starts a new session."
RESUME_TASK_MISMATCH = "The A2A task identity does not match the interrupted run."
RESUME_NOT_ACCEPTED = "The A2A execution service did not accept the interrupt response."
RESUME_REJECTED = "The local A2A execution service rejected the interrupt response."
SESSION_BACKUP_NOT_READY = "Session backup is still synchronizing. Retry after 3 seconds."
EXECUTION_EXPIRED = "The interrupt expired at {expiresAt}; start a new run."
CANCELLED_BY_RESPONSE = "The execution was cancelled by the interrupt response."
EXECUTION_NOT_FOUND = "The execution was not found."

# --- reattach (journal) --------------------------------------------------------------
RUN_NOT_FOUND = "The run was not found, or its events are no longer kept."
REPLAY_UNAVAILABLE = "The run's events after that id are no longer kept; start the run again."
LAST_EVENT_ID_INVALID = "Last-Event-ID must be the id of an event of this run (a whole number)."

# --- the thread resource (GET /threads/{threadId}, .../messages) ---------------------
THREAD_NOT_FOUND = "The thread was not found."
THREAD_PATH_HEADER_MISMATCH = "The X-AGUI-Thread-Id header must equal the threadId in the path."
HISTORY_LIMIT_INVALID = "The limit parameter must be a whole number from 1 to {limit}."
HISTORY_CURSOR_INVALID = "The before parameter must be a nextCursor returned by this route."


def all_messages() -> dict[str, str]:
    """Every message constant of this module, by name."""
    return {name: value for name, value in globals().items() if name.isupper() and isinstance(value, str)}

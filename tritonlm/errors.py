"""The errors the Triton models report in a way the frontend must recognise, and the messages
more than one model words the same."""

# Triton relays a decoupled model's error over the gRPC stream as text only, without its status
# code, so client mistakes carry this marker in their message; the frontend answers them with 4xx.
CLIENT_ERROR_MARKER = "[invalid argument]"
# The engine's waiting queue is full: the frontend answers 429 with Retry-After.
OVERLOAD_MARKER = "[overloaded]"


class InvalidRequest(ValueError):
    """A request the client must fix; reported as INVALID_ARG, its message naming the input."""

    def __str__(self) -> str:
        return f"{CLIENT_ERROR_MARKER} {super().__str__()}"


def overloaded_message(waiting: int) -> str:
    return (
        f"{OVERLOAD_MARKER} the server is overloaded: {waiting} requests are already waiting for the "
        "engine (max_queue_size); retry later"
    )


def prompt_too_long(tokens: int, max_seq_len: int) -> InvalidRequest:
    """The prompt leaves no room for a new token; named input_ids, where the engine counts it."""
    return InvalidRequest(
        f"input_ids: the prompt has {tokens} tokens; this model accepts at most {max_seq_len - 1}"
    )

"""The one exception for a client's mistake, shared by every Triton model of the repository."""

# Triton relays a decoupled model's error over the gRPC stream as text only, without its status
# code, so client mistakes carry this marker in their message; the frontend answers them with 4xx.
CLIENT_ERROR_MARKER = "[invalid argument]"


class InvalidRequest(ValueError):
    """A request the client must fix; reported as INVALID_ARG, its message naming the input."""

    def __str__(self) -> str:
        return f"{CLIENT_ERROR_MARKER} {super().__str__()}"

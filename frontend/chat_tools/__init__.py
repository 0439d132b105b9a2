"""Function calling and reasoning for chat replies: the request's tools and tool_choice
(`tools.py`), the model's text split into thought, answer and tool calls (`reply.py`, with one
parser per format in `parsers/`)."""

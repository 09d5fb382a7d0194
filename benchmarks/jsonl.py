"""One measurement record: printed as a JSON line and appended to a ``.jsonl`` file."""
import json


def emit(rec: dict, out: str | None = None) -> None:
    """Print ``rec`` as one JSON line (flushed) and append it to ``out`` when given."""
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")

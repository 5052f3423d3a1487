"""Edit a report document at a slash-separated path ("tasks/0/shapes/1/name"), as the schema
tests do to make one field invalid at a time."""

from __future__ import annotations


def _parent(doc: dict, path: str) -> tuple[object, str]:
    *parents, last = path.split("/")
    node: object = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
    return node, last


def set_at(doc: dict, path: str, value: object) -> None:
    node, last = _parent(doc, path)
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value  # type: ignore[index]


def delete_at(doc: dict, path: str) -> None:
    node, last = _parent(doc, path)
    del node[int(last) if isinstance(node, list) else last]  # type: ignore[attr-defined]

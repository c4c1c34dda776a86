"""Renders conversations with a tokenizer_config.json's chat template using
Python's Jinja2 in the environment transformers' apply_chat_template sets up
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson as
json.dumps(ensure_ascii=False), raise_exception). The Go tests of model/chat
compare their renderers against its output.

Usage: python3 render.py TOKENIZER_CONFIG.json CASES.json
CASES.json: [{"messages": [...], "tools": [...], "add_generation_prompt": bool}]
Prints a JSON array: the rendered string of each case.
"""
import json
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise ValueError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def main():
    config = json.load(open(sys.argv[1], encoding="utf-8"))
    cases = json.load(open(sys.argv[2], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(config["chat_template"])
    out = []
    for c in cases:
        out.append(template.render(messages=c["messages"], tools=c.get("tools") or None,
                                   add_generation_prompt=c.get("add_generation_prompt", False),
                                   eos_token=config.get("eos_token"), bos_token=config.get("bos_token")))
    sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

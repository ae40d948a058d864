"""Renders the chat-template test vectors of dataplane/tokenizer with Python Jinja2, configured
as Hugging Face transformers configures it for apply_chat_template: an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loopcontrols extension, a {% generation %} tag that
renders its body, a tojson filter that is json.dumps(ensure_ascii=False, indent, separators,
sort_keys), and the globals raise_exception and strftime_now (here at a fixed time, so the output
is deterministic). None of our Go code runs here.

    python3 render.py        # writes ../vectors/jinja.json and ../vectors/chat.json
"""
import datetime
import json
import os

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = datetime.datetime(2024, 7, 26, 13, 5, 9)


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders the body (transformers uses it to mark the
    assistant's tokens; the text is unchanged)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def render(env, source, context):
    try:
        return {"out": env.from_string(source).render(**context)}
    except Exception as e:  # the Go side only has to fail too; the class is recorded for reading
        return {"error": type(e).__name__ + ": " + str(e)}


def jinja_cases(env):
    with open(os.path.join(HERE, "jinja_cases.json")) as f:
        cases = json.load(f)
    return [dict(template=c["t"], context=c.get("c", {}), **render(env, c["t"], c.get("c", {}))) for c in cases]


def chat_cases(env):
    tdir = os.path.join(HERE, "..", "..", "templates")
    with open(os.path.join(HERE, "chat_cases.json")) as f:
        conversations = json.load(f)
    special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None}
    out = []
    for name in sorted(os.listdir(tdir)):
        source = open(os.path.join(tdir, name)).read()
        for conv in conversations:
            for agp in (False, True):
                ctx = dict(special, messages=conv["messages"], add_generation_prompt=agp, tools=None, documents=None,
                           **conv.get("kwargs", {}))
                out.append(dict(template=name, conversation=conv["name"], add_generation_prompt=agp,
                                kwargs=conv.get("kwargs", {}), **render(env, source, ctx)))
    return out


def main():
    env = environment()
    vectors = os.path.join(HERE, "..", "vectors")
    meta = {"generator": "jinja2 %s (Python %s)" % (jinja2.__version__, ".".join(map(str, __import__("sys").version_info[:3]))),
            "now": NOW.isoformat()}
    with open(os.path.join(vectors, "jinja.json"), "w") as f:
        json.dump(dict(meta, cases=jinja_cases(env)), f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(vectors, "chat.json"), "w") as f:
        json.dump(dict(meta, special=None, cases=chat_cases(env)), f, ensure_ascii=False, indent=0)
        f.write("\n")


main()

"""Each `batchcast serve` option is declared once (server/serve/serve_options.h; the transform's
are the view fields of decoders/view.h): the program's --help, the Python ServeConfig's fields and
keyword defaults, docs/options.md and the .pyi stub all come from that declaration, and fail here
when one of them is not what the declaration makes (run `python scripts/options_doc.py --write`
after changing an option)."""

import importlib.util
import os
import re
import subprocess

import batchcast
from batchcast import _batchcast
from batchcast.server import find_binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _options_doc():
    spec = importlib.util.spec_from_file_location(
        "options_doc", os.path.join(ROOT, "scripts", "options_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_and_the_stub_are_what_the_declaration_makes():
    doc = _options_doc()
    with open(doc.DOC) as f:
        assert f.read() == doc.options_md(), "run: python scripts/options_doc.py --write"
    with open(doc.STUB) as f:
        assert f.read() == doc.stub_text(), "run: python scripts/options_doc.py --write"


def test_every_option_is_a_flag_of_the_program_and_a_field_of_the_config():
    help_text = subprocess.run([find_binary(), "serve", "--help"], capture_output=True,
                               text=True, check=True).stdout
    config = _batchcast.ServeConfig()
    rows = _batchcast.ServeConfig.options()
    assert len({r["flag"] for r in rows}) == len(rows), "a flag is declared twice"
    for row in rows:
        assert re.search(rf"\s{re.escape(row['flag'])}(?![\w-])", help_text), row["flag"]
        target, _, name = row["name"].rpartition(".")
        assert hasattr(config.transform if target else config, name), row["name"]


def test_a_view_is_a_value_and_its_fields_are_the_native_list():
    transform = _batchcast.PipelineOptions(seed=5)
    view = _batchcast.View.resolve("size=160,crop=center", _batchcast.View(transform))
    assert view == _batchcast.View.parse(view.text())
    assert view == _batchcast.View.resolve("crop=center,size=160,resize=182",
                                           _batchcast.View(transform))
    assert view != _batchcast.View.resolve("size=160", _batchcast.View(transform))
    assert _batchcast.View.resolve("", _batchcast.View(transform)).options.seed == 5
    assert batchcast._views.FIELDS == tuple(_batchcast.View.fields)
    assert [f.split("=")[0] for f in view.text().split(",")] == list(_batchcast.View.fields)
    # A View is what Loader(view=) and serve(views=) take besides a text or a dict.
    assert batchcast._views.view_text(view) == view.text()

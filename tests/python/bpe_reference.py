"""Byte-level BPE reference from Hugging Face `tokenizers` for tests/core/io/bpe_tokenizer_test.cpp.

  bpe_reference.py build TEXT OUT   trains a 2,000-token byte-level BPE on the first 95% of TEXT's lines
                                    (special tokens <|endoftext|> and <pad>), saves OUT/tokenizer.json,
                                    OUT/vocab.json and OUT/merges.txt, and writes OUT/expected.json: the
                                    ids of held-out texts (the last 5% of the lines, and strings with
                                    non-ASCII, runs of spaces and newlines, digits and special tokens);
                                    OUT/prefix: vocab.json + merges.txt with tokenizer_config.json's
                                    add_prefix_space = true, and OUT/lower: tokenizer.json with an NFC +
                                    Lowercase normalizer, each with the ids transformers' AutoTokenizer
                                    gives (expected_prefix.json, expected_lower.json); OUT/replace: a
                                    tokenizer.json with a Replace normalizer other than CLIP's
                                    whitespace one (quotes to a letter), which Kuafu refuses;
                                    OUT/llama3 and OUT/qwen2: tokenizers laid out as Llama 3's and Qwen2's
                                    folders lay theirs out (a Split by the family's pattern, behavior
                                    Isolated, then ByteLevel without GPT-2's pattern; Llama 3's BPE with
                                    ignore_merges, Qwen's after an NFC normalizer; the families' special
                                    tokens), trained on the same lines, with the ids and decoded texts
                                    transformers' AutoTokenizer gives (expected_llama3.json, expected_qwen2.json)
  bpe_reference.py sentencepiece TEXT OUT
                                    trains a SentencePiece-style BPE (characters, spaces as "\u2581", the
                                    256 <0xNN> byte tokens for characters outside the vocabulary, <unk>, <s>,
                                    </s>) on the same 95% of TEXT's lines and lays it out as Llama 2's,
                                    Mistral's and TinyLlama's tokenizer.json do: OUT/sp_legacy (normalizer
                                    Prepend + Replace, no pre-tokenizer; tokenizer_config.json legacy true),
                                    OUT/sp_metaspace (Metaspace prepend_scheme first, split false; legacy
                                    false), OUT/sp_never (the same file, add_prefix_space false), each read
                                    by transformers as LlamaTokenizerFast; OUT/sp_split (NFKC, Metaspace
                                    always with split, Metaspace decoder) read as PreTrainedTokenizerFast.
                                    OUT/expected_<name>.json: for each text (SP_CASES and the held-out
                                    lines) AutoTokenizer's ids with BOS and its decode of them with and
                                    without the BOS, and the ids and decoded text of the tokenizer.json
                                    alone (`tokenizers`.Tokenizer.from_file, no special tokens added)
  bpe_reference.py spm TEXT OUT     trains a SentencePiece BPE model with the `sentencepiece` library as
                                    Llama 2's was trained (identity normalisation, spaces kept, digits
                                    split, byte fallback; <unk> <s> </s>, a control piece <ctl> and a
                                    user-defined <sep>) on the same 95% of TEXT's lines, and lays out folders
                                    holding that tokenizer.model and no tokenizer.json, read by transformers as
                                    LlamaTokenizer: OUT/spm_first (legacy false), OUT/spm_legacy (legacy
                                    true), OUT/spm_never (add_prefix_space false); OUT/spm_saved is spm_first
                                    saved again by transformers (its tokenizer.json). OUT/expected_<name>.json:
                                    for each text (SP_CASES, SPM_CASES and the held-out lines) AutoTokenizer's
                                    ids (no special tokens added) and its decode of them, sentencepiece's own
                                    ids, and AutoTokenizer's ids with its special tokens (add_bos_token true);
                                    OUT/spm_pieces.json: the model's pieces by id
  bpe_reference.py framing TEXT OUT one byte-level BPE (600 tokens, on 3,000 of the same lines) in folders that
                                    differ in what transformers' tokenizer(text) adds around a text: the
                                    tokenizer.json's post_processor (TemplateProcessing with a BOS, as Llama 3;
                                    a Sequence of ByteLevel and that, as Llama 3.1; ByteLevel alone, as Qwen2;
                                    none; RobertaProcessing; BertProcessing; a template with tokens on both
                                    sides), tokenizer_config.json's add_bos_token / add_eos_token beside a
                                    tokenizer.json (transformers 5 ignores them) and beside vocab.json +
                                    merges.txt (GPT2Tokenizer reads them); added tokens with lstrip / rstrip.
                                    OUT/expected_framing.json: per
                                    folder, AutoTokenizer's ids of two texts with and without special tokens
"""
import json
import pathlib
import sys

import shutil

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

CASES = [
    "In the beginning God created the heaven and the earth.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquoted\u201d \u4e2d\u6587 \u0928\u092e\u0938\u094d\u0924\u0947 \U0001F642 \u00bd",
    "spaces    between  words   \n\n\n  and\ttabs\t\tand trailing   ",
    "digits 1234567890 3.14159 2,000,000 and 42nd",
    "before<|endoftext|>after <|endoftext|> <pad><pad>end",
    "  leading spaces and a final newline\n",
    "don't can't I'm we're they've you'll he'd 's",
    "\u00e9\u00e9\u00e9\u00e9\u00e9 aaaaaaaaaa \u3000\u3000full-width spaces",
]


# The pre-tokenizer patterns of Llama 3's and Qwen2's tokenizer.json (numbers in runs of up to 3 digits,
# or one digit at a time).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
FAMILY_CASES = CASES + ["<|begin_of_text|>Hello<|end_of_text|> <|im_start|>user\nHi \U0001F468\u200D\U0001F469\u200D\U0001F467!<|im_end|>\n",
                        "\r\n\r\n  \t 12345678 \u0663\u0664\u0665 x\u00b2 \u2460 'S 'LL YOU'RE",
                        "\u4e2d\u6587\u6c49\u5b57\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002 \ud55c\uad6d\uc5b4"]


def build_family(train, out, name, pattern, special, ignore_merges, nfc):
    folder = out / name
    folder.mkdir(exist_ok=True)
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(train)], trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    auto = AutoTokenizer.from_pretrained(str(folder))
    expected = []
    for t in FAMILY_CASES + [train.read_text(encoding="utf-8")[:20000]]:
        ids = auto(t, add_special_tokens=False)["input_ids"]
        expected.append({"text": t, "ids": ids, "decoded": auto.decode(ids)})
    (out / f"expected_{name}.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")


def split_text(text_path, out):
    """OUT/train.txt: the first 95% of TEXT's lines; returns its path and the other 5% (held out)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = pathlib.Path(text_path).read_text(encoding="utf-8").splitlines(keepends=True)
    cut = len(lines) * 95 // 100
    train = out / "train.txt"
    train.write_text("".join(lines[:cut]), encoding="utf-8")
    return train, "".join(lines[cut:])


def build(text_path, out):
    out = pathlib.Path(out)
    train, held_out = split_text(text_path, out)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(train)], trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer.model.save(str(out))  # vocab.json, merges.txt
    texts = [held_out] + CASES
    expected = [{"text": t, "ids": tokenizer.encode(t).ids} for t in texts]
    (out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")

    # add_prefix_space in tokenizer_config.json beside vocab.json + merges.txt, as GPT-2 / RoBERTa folders have it.
    prefix = out / "prefix"
    prefix.mkdir(exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(out / name, prefix / name)
    (prefix / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True, "bos_token": "<|endoftext|>",
         "eos_token": "<|endoftext|>", "pad_token": "<pad>"}))
    auto = AutoTokenizer.from_pretrained(str(prefix))
    (out / "expected_prefix.json").write_text(json.dumps(
        [{"text": t, "ids": auto(t, add_special_tokens=False)["input_ids"]} for t in CASES], ensure_ascii=False),
        encoding="utf-8")

    # A normalizer: NFC then lower case (CLIP's tokenizer lower-cases too).
    lower = out / "lower"
    lower.mkdir(exist_ok=True)
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tokenizer.save(str(lower / "tokenizer.json"))
    (lower / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    auto = AutoTokenizer.from_pretrained(str(lower))
    cased = CASES + ["CAPITALS And MiXeD \u00c9T\u00c9 \u0130stanbul \u03a3\u039f\u03a6\u0399\u0391 e\u0301"]
    (out / "expected_lower.json").write_text(json.dumps(
        [{"text": t, "ids": auto(t, add_special_tokens=False)["input_ids"]} for t in cased], ensure_ascii=False),
        encoding="utf-8")

    build_family(train, out, "llama3", LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>"], True, False)
    build_family(train, out, "qwen2", QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False, True)

    replace = out / "replace"
    replace.mkdir(exist_ok=True)
    tokenizer.normalizer = normalizers.Replace(Regex("[\"']"), "q")
    tokenizer.save(str(replace / "tokenizer.json"))
    print(json.dumps({"vocab": tokenizer.get_vocab_size(), "held_out_bytes": len(texts[0].encode())}))


# SentencePiece-style BPE (Llama 2, Mistral, TinyLlama): "▁" stands for a space; a character outside the
# vocabulary is spelt by its UTF-8 bytes' tokens <0x00> .. <0xFF>.
SPACE_MARK = "\u2581"
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
SP_CASES = FAMILY_CASES + [
    "<s>[INST] Hello there [/INST] Hi!</s><s>[INST]  twice, after two spaces</s>x",
    " one leading space, then text after a special token:</s>and more",
    "a literal \u2581 mark, \u2581\u2581 two, and <0x41> <0xZZ> written out",
    "", " ", "   ", "\n", "\t\ttabs first",
    "CJK \u6f22\u5b57 and emoji \U0001F600\U0001F44D\U0001F3FD in one line \u00e9\u00e8",
]
LLAMA2_DECODER = decoders.Sequence([decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(content=" ", left=1, right=0)])


def train_sentencepiece(train):
    """A BPE over characters with byte fallback, trained on words as Metaspace cuts them (so its tokens
    begin with "▁" as SentencePiece's do): ids 0-2 <unk> <s> </s>, 3-258 the byte tokens. The byte tokens
    are the model's vocabulary, not added tokens (as in Llama 2's file), so text spelling one is plain text."""
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1800, special_tokens=["<unk>", "<s>", "</s>"] + BYTE_TOKENS,
                                  show_progress=False)
    tokenizer.train([str(train)], trainer)
    layout = json.loads(tokenizer.to_str())
    layout["added_tokens"] = [t for t in layout["added_tokens"] if t["content"] not in BYTE_TOKENS]
    tokenizer = Tokenizer.from_str(json.dumps(layout))
    assert tokenizer.token_to_id("<0x00>") == 3 and tokenizer.token_to_id("<0xFF>") == 258
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 1)])
    return tokenizer


def write_sentencepiece(tokenizer, texts, out, name, config):
    """OUT/name: tokenizer.json and tokenizer_config.json (`config` over Llama 2's special tokens);
    OUT/expected_name.json: what transformers' AutoTokenizer and the file alone give for `texts`."""
    folder = out / name
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                "add_eos_token": False, "clean_up_tokenization_spaces": False}
    settings.update(config)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    auto = AutoTokenizer.from_pretrained(str(folder))
    file = Tokenizer.from_file(str(folder / "tokenizer.json"))
    expected = []
    for t in texts:
        ids = auto(t)["input_ids"]
        # BOS first, no EOS: the ids of the text alone follow the BOS.
        assert ids[0] == 1 and ids[1:] == auto(t, add_special_tokens=False)["input_ids"], (name, t)
        file_ids = file.encode(t, add_special_tokens=False).ids
        expected.append({"text": t, "ids": ids, "decoded": auto.decode(ids),
                         "decoded_without_bos": auto.decode(ids[1:]), "file_ids": file_ids,
                         "file_decoded": file.decode(file_ids, skip_special_tokens=False)})
    (out / f"expected_{name}.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")
    return expected


def build_sentencepiece(text_path, out):
    out = pathlib.Path(out)
    train, held_out = split_text(text_path, out)
    texts = SP_CASES + [held_out]
    tokenizer = train_sentencepiece(train)
    tokenizer.decoder = LLAMA2_DECODER
    # The older layout (Llama 2's own file): the normalizer puts in the "▁"s, the whole text one piece.
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE_MARK), normalizers.Replace(" ", SPACE_MARK)])
    tokenizer.pre_tokenizer = None
    llama = {"tokenizer_class": "LlamaTokenizerFast"}
    legacy = write_sentencepiece(tokenizer, texts, out, "sp_legacy", {**llama, "legacy": True})
    # transformers 5's LlamaTokenizer reads such a file as Metaspace (prepend_scheme always, from legacy true),
    # not by its normalizer: a text after a special token or starting with a space differs from the file's.
    assert any(item["ids"][1:] != item["file_ids"] for item in legacy)
    # The newer layout (transformers' converter, legacy false): Metaspace "first", the whole text one piece.
    tokenizer.normalizer = None
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="first", split=False)
    metaspace = write_sentencepiece(tokenizer, texts, out, "sp_metaspace", {**llama, "legacy": False})
    assert all(item["ids"][1:] == item["file_ids"] for item in metaspace)
    write_sentencepiece(tokenizer, texts, out, "sp_never", {**llama, "add_prefix_space": False})
    # SentencePieceBPETokenizer's layout: NFKC, Metaspace "always" cutting words at each "▁", Metaspace decoder.
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE_MARK, prepend_scheme="always", split=True)
    write_sentencepiece(tokenizer, texts, out, "sp_split", {"tokenizer_class": "PreTrainedTokenizerFast"})
    print(json.dumps({"vocab": tokenizer.get_vocab_size(), "texts": len(texts),
                      "held_out_bytes": len(held_out.encode())}))


# Text holding the model's control (<s>, </s>, <ctl>), unknown and user-defined (<sep>) pieces written out.
SPM_CASES = ["x</s>y<sep>z<ctl> w<unk>v <s>", "<sep><sep> after two user-defined pieces"]


def build_spm(text_path, out):
    import sentencepiece

    out = pathlib.Path(out)
    train, held_out = split_text(text_path, out)
    prefix = out / "spm"
    # Llama 2's trainer settings (its tokenizer.model's trainer_spec), at a vocabulary of 1,800.
    sentencepiece.SentencePieceTrainer.train(
        input=str(train), model_prefix=str(prefix), model_type="bpe", vocab_size=1800, byte_fallback=True,
        character_coverage=0.9999, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, allow_whitespace_only_pieces=True, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, control_symbols=["<ctl>"], user_defined_symbols=["<sep>"], num_threads=1, minloglevel=2)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(prefix) + ".model")
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    (out / "spm_pieces.json").write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")
    texts = SP_CASES + SPM_CASES + [held_out]
    llama = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
             "add_bos_token": True, "add_eos_token": False,
             "added_tokens_decoder": {str(i): {"content": pieces[i], "special": True} for i in range(3)}}
    for name, config in (("spm_first", {"legacy": False}), ("spm_legacy", {"legacy": True}),
                         ("spm_never", {"legacy": False, "add_prefix_space": False})):
        folder = out / name
        folder.mkdir(exist_ok=True)
        shutil.copy(str(prefix) + ".model", folder / "tokenizer.model")
        (folder / "tokenizer_config.json").write_text(json.dumps({**llama, **config}))
        auto = AutoTokenizer.from_pretrained(str(folder))
        expected = []
        for t in texts:
            ids = auto(t, add_special_tokens=False)["input_ids"]
            expected.append({"text": t, "ids": ids, "decoded": auto.decode(ids), "sp_ids": processor.encode(t),
                             "with_special": auto(t)["input_ids"]})
        (out / f"expected_{name}.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")
        if name == "spm_first":
            auto.save_pretrained(str(out / "spm_saved"))
            assert (out / "spm_saved" / "tokenizer.json").exists()
    print(json.dumps({"pieces": len(pieces), "texts": len(texts), "held_out_bytes": len(held_out.encode())}))


FRAMING_TEXTS = ["Hello there", ""]
STRIP_TEXTS = FRAMING_TEXTS + ["Hello  <mask> there <tool>  end\t<mask>\n<tool>x", "  <mask>x<both>\u3000 y <both>",
                               "a<tool>\u00a0\u2003b <mask><mask> <tool> <tool>"]


def build_framing(text_path, out):
    """Folders that differ in what transformers' tokenizer(text) adds around a text's ids, one byte-level BPE."""
    out = pathlib.Path(out)
    train, _ = split_text(text_path, out)
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)[:3000]
    small = out / "framing_train.txt"
    small.write_text("".join(lines), encoding="utf-8")
    specials = ["<s>", "</s>", "<|begin_of_text|>", "[CLS]", "[SEP]", "<|endoftext|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train([str(small)], trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    ids = {t: tokenizer.token_to_id(t) for t in specials}
    fast = {"tokenizer_class": "PreTrainedTokenizerFast"}
    bos = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                        special_tokens=[("<|begin_of_text|>", ids["<|begin_of_text|>"])])
    layouts = {
        # Llama 3's: a template putting its BOS first; Llama 3.1's: ByteLevel then that template.
        "template_bos": (bos, fast),
        "sequence_bos": (processors.Sequence([processors.ByteLevel(trim_offsets=False), bos]), fast),
        # Qwen2's: ByteLevel alone adds nothing.
        "byte_level": (processors.ByteLevel(trim_offsets=False), fast),
        # add_bos_token / add_eos_token named in tokenizer_config.json replace the file's post-processor.
        "flags_override": (bos, {**fast, "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
                                 "add_eos_token": True}),
        # No post-processor: the flags (false when absent) decide.
        "none_bos_eos": (None, {**fast, "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                                "add_eos_token": True}),
        "none": (None, {**fast, "bos_token": "<s>", "eos_token": "</s>"}),
        "roberta": (processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]),
                                                 trim_offsets=False, add_prefix_space=False), fast),
        "bert": (processors.BertProcessing(("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"])), fast),
        "template_both": (processors.TemplateProcessing(single="[CLS] <s> $A:0 </s>", pair="$A $B",
                                                        special_tokens=[("[CLS]", ids["[CLS]"]), ("<s>", ids["<s>"]),
                                                                        ("</s>", ids["</s>"])]), fast),
    }
    expected = {}
    for name, (processor, config) in layouts.items():
        folder = out / f"framing_{name}"
        folder.mkdir(exist_ok=True)
        tokenizer.post_processor = processor
        tokenizer.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        expected[name] = framing_of(folder)
    # Added tokens that take the whitespace before (lstrip) or after (rstrip) them.
    folder = out / "framing_strip"
    folder.mkdir(exist_ok=True)
    tokenizer.post_processor = None
    tokenizer.add_tokens([AddedToken("<mask>", lstrip=True), AddedToken("<tool>", rstrip=True),
                          AddedToken("<both>", lstrip=True, rstrip=True, special=True)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(fast))
    expected["strip"] = framing_of(folder, STRIP_TEXTS)
    # vocab.json + merges.txt (GPT2Tokenizer): add_bos_token with its BOS.
    folder = out / "framing_files_bos"
    folder.mkdir(exist_ok=True)
    tokenizer.model.save(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
         "add_bos_token": True}))
    expected["files_bos"] = framing_of(folder)
    (out / "expected_framing.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")
    print(json.dumps({name: e[0]["with"] for name, e in expected.items()}))


def framing_of(folder, texts=FRAMING_TEXTS):
    auto = AutoTokenizer.from_pretrained(str(folder))
    return [{"text": t, "with": auto(t)["input_ids"], "without": auto(t, add_special_tokens=False)["input_ids"]}
            for t in texts]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "sentencepiece":
        build_sentencepiece(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "spm":
        build_spm(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "framing":
        build_framing(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: bpe_reference.py build|sentencepiece|spm|framing TEXT OUT")

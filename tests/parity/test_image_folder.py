"""test_image_folder.py — onyx's image folders (src/data/image_folder.h; `type: image_folder`)
against Hugging Face datasets' imagefolder builder and the torchvision transforms diffusers'
training scripts apply (train_text_to_image.py, train_unconditional.py), through `onyx batch`,
which writes the batch a config's dataset gives.

Cases (one PASS / FAIL line each):
  pixels            PNG (RGB, RGBA, palette, 1-bit, 16-bit gray, 16-bit RGB, interlaced) and JPEG
                    (RGB, gray, progressive, EXIF orientations 3, 6, 8) files of many sizes (shrunk
                    and enlarged, portrait and landscape) from metadata.jsonl in a train/ split:
                    pixel_values equal load_dataset("imagefolder") rows through Resize(R, BILINEAR),
                    CenterCrop(R), ToTensor, Normalize([0.5], [0.5]), exactly; also channels 1
                    (convert("L"))
  random-crop-flip  center_crop false, random_flip true: every image is one of the R x R windows of
                    the resized image, flipped or not; an epoch repeats itself, another epoch draws
                    other crops
  class-folders     no metadata, images in class folders: labels as datasets' ClassLabel (sorted
                    folder names); a single folder gives no labels
  captions          metadata.csv captions (strings and lists) through the pipeline's tokenizer:
                    input_ids equal CLIPTokenizer(padding="max_length", truncation=True); a list
                    gives its first caption in evaluation and one of its captions in training
  bad-input         a file_name leaving the folder, a missing file, a truncated PNG, a CMYK JPEG,
                    a WebP file, an empty folder: a non-zero exit and a message naming the file
  train-from-folder train_text_to_image.py's run from an image folder with captions: onyx train
                    on the folder logs the losses of the same run on the batch `onyx batch` wrote

torchvision comes from build/torchvision-ref (scripts/setup.sh: its PyPI wheel's operators are
built for CUDA's torch and cannot load beside the CPU torch, so the import stubs their
registration; the transforms used here are Python over PIL).

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_image_folder.py
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import subprocess
import sys
import types

import numpy as np
from PIL import Image
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from case_runner import run_cases  # noqa: E402

ONYX = os.environ.get("ONYX", "build/onyx")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHVISION = os.path.join(os.path.dirname(os.path.abspath(ONYX)), "torchvision-ref")


def transforms():
    """torchvision.transforms from build/torchvision-ref (see the header)."""
    sys.modules.setdefault("torchvision._meta_registrations",
                           types.ModuleType("torchvision._meta_registrations"))
    if TORCHVISION not in sys.path:
        sys.path.append(TORCHVISION)
    from torchvision import transforms as T
    return T


def onyx(*args, check=True):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def write_config(path, **cfg):
    cfg.setdefault("model", ".")  # (onyx batch reads only the data; a model must be named)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def batch(tmp, data, rows=None, name="batch", epoch=0, extra=None):
    """`onyx batch` of a config whose train_data is `data` (a dict spec)."""
    cfg = write_config(f"{tmp}/{name}.json", train_data=data, **(extra or {}))
    args = ["batch", cfg, "--output", f"{tmp}/{name}.safetensors", "--epoch", str(epoch)]
    if rows is not None:
        args += ["--rows", ",".join(map(str, rows))]
    onyx(*args)
    return load_file(f"{tmp}/{name}.safetensors")


def save_images(folder):
    """The images of the pixels case: (file name, writer) in metadata order."""
    rng = np.random.default_rng(3)

    def rgb(h, w):
        # smooth content plus noise, so resizing has something to average
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) % 256], -1)
        return np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)

    exif = {}
    for o in (3, 6, 8):
        e = Image.Exif()
        e[0x0112] = o
        exif[o] = e
    items = [
        ("rgb-landscape.png", lambda p: Image.fromarray(rgb(37, 53)).save(p)),
        ("rgb-portrait.png", lambda p: Image.fromarray(rgb(71, 40)).save(p)),
        ("rgb-small.png", lambda p: Image.fromarray(rgb(9, 12)).save(p)),  # enlarged
        ("rgb-exact.png", lambda p: Image.fromarray(rgb(16, 16)).save(p)),
        ("rgb-big.png", lambda p: Image.fromarray(rgb(203, 157)).save(p)),  # shrunk 10x
        ("rgba.png", lambda p: Image.fromarray(
            np.concatenate([rgb(30, 25), rng.integers(0, 256, (30, 25, 1), dtype=np.uint8)], -1),
            "RGBA").save(p)),
        ("palette.png", lambda p: Image.fromarray(rgb(24, 33)).convert("P").save(p)),
        ("bits.png", lambda p: Image.fromarray(rng.integers(0, 2, (20, 27)).astype(bool)).save(p)),
        ("gray16.png", lambda p: Image.fromarray(
            rng.integers(0, 400, (26, 19)).astype(np.uint16)).save(p)),
        ("interlaced.png", lambda p: Image.fromarray(rgb(29, 31)).save(p, interlace=1)),
        ("photo.jpg", lambda p: Image.fromarray(rgb(48, 64)).save(p, quality=85)),
        ("gray.jpeg", lambda p: Image.fromarray(rgb(33, 21)).convert("L").save(p, quality=90)),
        ("progressive.jpg", lambda p: Image.fromarray(rgb(40, 35)).save(p, progressive=True)),
        ("rotated3.jpg", lambda p: Image.fromarray(rgb(20, 36)).save(p, exif=exif[3])),
        ("rotated6.jpg", lambda p: Image.fromarray(rgb(20, 36)).save(p, exif=exif[6])),
        ("sub/rotated8.JPG", lambda p: Image.fromarray(rgb(44, 18)).save(p, "JPEG",
                                                                          exif=exif[8])),
    ]
    # 16-bit RGB: PIL writes it only through a raw PNG; numpy's big-endian bytes via zlib
    items.append(("rgb16.png", lambda p: write_png16(p, rng.integers(0, 65536, (13, 22, 3)))))
    for name, write in items:
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        write(os.path.join(folder, name))
    return [name for name, _ in items]


def write_png16(path, rgb16):
    import struct
    import zlib
    h, w, _ = rgb16.shape
    raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def reference_pixels(folder, split, resolution, mode="RGB"):
    """datasets' imagefolder rows through the scripts' transforms (center crop, no flip)."""
    import datasets
    T = transforms()
    ds = datasets.load_dataset("imagefolder", data_dir=folder, split=split)
    t = T.Compose([T.Resize(resolution, interpolation=T.InterpolationMode.BILINEAR),
                   T.CenterCrop(resolution), T.ToTensor(), T.Normalize([0.5], [0.5])])
    return np.stack([t(row["image"].convert(mode)).numpy() for row in ds]), ds


def case_pixels(tmp):
    folder = f"{tmp}/pix"
    names = save_images(f"{folder}/train")
    with open(f"{folder}/train/metadata.jsonl", "w") as f:
        for n in names:
            f.write(json.dumps({"file_name": n, "text": f"an image called {n}"}) + "\n")
    msgs, ok = [], True
    for mode, channels in (("RGB", 3), ("L", 1)):
        want, ds = reference_pixels(folder, "train", 16, mode)
        got = batch(tmp, {"type": "image_folder", "folder": folder, "resolution": 16,
                          "center_crop": True, "channels": channels},
                    rows=range(len(names)), name=f"pix-{mode}")["pixel_values"]
        if got.shape != want.shape:
            return False, f"{mode}: shape {got.shape}, datasets + torchvision {want.shape}"
        diff = np.abs(got - want).reshape(len(names), -1).max(1)
        bad = [names[i] for i in np.nonzero(diff > 0)[0]]
        ok &= not bad
        msgs.append(f"{mode}: {len(names)} images, largest difference {diff.max():.1e}"
                    + (f" in {bad}" if bad else ""))
    return ok, "; ".join(msgs)


def windows(resized, R):
    """Every R x R window of a (C, H, W) array, flipped and not."""
    C, H, W = resized.shape
    for top in range(H - R + 1):
        for left in range(W - R + 1):
            w = resized[:, top:top + R, left:left + R]
            yield w
            yield w[:, :, ::-1]


def case_random_crop_flip(tmp):
    folder = f"{tmp}/crop"
    names = sorted(save_images(f"{folder}/train"))[:6]  # no metadata: the rows in path order
    T = transforms()
    spec = {"type": "image_folder", "folder": folder, "resolution": 12, "random_flip": True}
    e0 = batch(tmp, spec, rows=range(6), name="crop0")["pixel_values"]
    e0b = batch(tmp, spec, rows=range(6), name="crop0b")["pixel_values"]
    e1 = batch(tmp, spec, rows=range(6), name="crop1", epoch=1)["pixel_values"]
    t = T.Compose([T.Resize(12, interpolation=T.InterpolationMode.BILINEAR), T.ToTensor(),
                   T.Normalize([0.5], [0.5])])
    found, flips = 0, 0
    for i, n in enumerate(names):
        resized = t(Image.open(f"{folder}/train/{n}").convert("RGB")).numpy()
        for epoch in (e0, e1):
            for j, w in enumerate(windows(resized, 12)):
                if np.array_equal(w, epoch[i]):
                    found += 1
                    flips += j % 2
                    break
    ok = found == 12 and np.array_equal(e0, e0b) and not np.array_equal(e0, e1) and 0 < flips < 12
    return ok, (f"{found}/12 images are windows of the resized image ({flips} flipped); epoch 0 "
                f"twice equal: {np.array_equal(e0, e0b)}; epoch 1 differs: "
                f"{not np.array_equal(e0, e1)}")


def case_class_folders(tmp):
    import datasets
    folder = f"{tmp}/classes"
    rng = np.random.default_rng(5)
    for cls, n in (("shirt", 2), ("boot", 3), ("Dress", 1)):
        os.makedirs(f"{folder}/{cls}")
        for k in range(n):
            Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(
                f"{folder}/{cls}/{k}.png")
    ds = datasets.load_dataset("imagefolder", data_dir=folder, split="train")
    want = np.array(ds["label"])
    want_px, _ = reference_pixels(folder, "train", 8)
    got = batch(tmp, {"type": "image_folder", "folder": folder, "resolution": 8,
                      "center_crop": True}, rows=range(6), name="cls")
    ok = np.array_equal(got["labels"], want) and np.array_equal(got["pixel_values"], want_px)
    os.makedirs(f"{tmp}/one/only")
    Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(f"{tmp}/one/only/a.png")
    single = batch(tmp, {"type": "image_folder", "folder": f"{tmp}/one", "resolution": 8},
                   rows=[0], name="one")
    ok &= "labels" not in single
    return ok, (f"labels {got['labels'].tolist()} (datasets {want.tolist()}, names "
                f"{ds.features['label'].names}); pixels equal: "
                f"{np.array_equal(got['pixel_values'], want_px)}; one folder: keys {sorted(single)}")


def clip_tokenizer(folder):
    from transformers import CLIPTokenizer
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("a", "n</w>"), ("i", "m"), ("im", "a"), ("s", "h"), ("sh", "i")]
    tokens = alphabet + [a + "</w>" for a in alphabet] + [a + b for a, b in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=14)
    tok.save_pretrained(folder)
    return tok


def case_captions(tmp):
    import csv
    folder = f"{tmp}/cap"
    os.makedirs(f"{folder}/train")
    rng = np.random.default_rng(9)
    captions = ["a shirt", "an image, in a \"quoted\" CSV field", "x" * 40,
                json.dumps(["first of a list", "second", "third"])]
    with open(f"{folder}/train/metadata.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file_name", "caption"])
        for i, c in enumerate(captions):
            Image.fromarray(rng.integers(0, 256, (12, 9, 3), dtype=np.uint8)).save(
                f"{folder}/train/{i}.png")
            w.writerow([f"{i}.png", c])
    tok = clip_tokenizer(f"{tmp}/cap-tok")
    spec = {"type": "image_folder", "folder": folder, "resolution": 8, "center_crop": True,
            "caption_column": "caption", "tokenizer": f"{tmp}/cap-tok"}
    # CSV cells are strings (datasets reads them so): the last row's "list" is one caption
    got = batch(tmp, spec, rows=range(4), name="cap")["input_ids"]
    want = tok(captions, padding="max_length", truncation=True, max_length=14).input_ids
    ok = np.array_equal(got, np.array(want))
    # lists of captions (JSONL): the first in evaluation, one of them in training
    with open(f"{folder}/train/metadata.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"file_name": f"{i}.png", "caption": ["one", "two", "three"][:i + 1]})
                    + "\n")
    os.remove(f"{folder}/train/metadata.csv")
    cfg = write_config(f"{tmp}/cap-eval.json", eval_data=spec)
    onyx("batch", cfg, "--data", "eval_data", "--output", f"{tmp}/cap-eval.safetensors",
         "--rows", "0,1,2,3")
    ev = load_file(f"{tmp}/cap-eval.safetensors")["input_ids"]
    first = tok(["one"] * 4, padding="max_length", max_length=14).input_ids
    ok &= np.array_equal(ev, np.array(first))
    choices = tok(["one", "two", "three"], padding="max_length", max_length=14).input_ids
    drawn = set()
    for epoch in range(6):
        tr = batch(tmp, spec, rows=[3], name=f"cap-tr{epoch}", epoch=epoch)["input_ids"][0]
        drawn.add(next((k for k, c in enumerate(choices) if np.array_equal(tr, c)), -1))
    ok &= -1 not in drawn and len(drawn) > 1
    return ok, (f"CSV captions as CLIPTokenizer's ids: {np.array_equal(got, np.array(want))}; "
                f"lists: first in evaluation {np.array_equal(ev, np.array(first))}, training drew "
                f"captions {sorted(drawn)} over 6 epochs")


def case_bad_input(tmp):
    rng = np.random.default_rng(2)

    def folder(name, files, metadata=None):
        d = f"{tmp}/bad-{name}"
        os.makedirs(d, exist_ok=True)
        for fname, data in files.items():
            with open(f"{d}/{fname}", "wb") as f:
                f.write(data)
        if metadata is not None:
            with open(f"{d}/metadata.jsonl", "w") as f:
                f.write("".join(json.dumps(m) + "\n" for m in metadata))
        return d

    Image.fromarray(rng.integers(0, 256, (9, 9, 3), dtype=np.uint8)).save(f"{tmp}/good.png")
    png = open(f"{tmp}/good.png", "rb").read()
    Image.fromarray(rng.integers(0, 256, (9, 9, 4), dtype=np.uint8), "CMYK").save(f"{tmp}/c.jpg")
    Image.fromarray(rng.integers(0, 256, (9, 9, 3), dtype=np.uint8)).save(f"{tmp}/w.webp")
    cases = [
        ("escape", folder("escape", {"a.png": png}, [{"file_name": "../good.png"}]),
         "must be a relative path inside"),
        ("missing", folder("missing", {"a.png": png}, [{"file_name": "b.png"}]),
         "'b.png' is not a file"),
        ("truncated", folder("truncated", {"a.png": png[:60]}), "a.png"),
        ("cmyk", folder("cmyk", {"c.jpg": open(f"{tmp}/c.jpg", "rb").read()}), "CMYK"),
        ("webp", folder("webp", {"a.png": png, "w.webp": open(f"{tmp}/w.webp", "rb").read()}),
         "w.webp' is an image onyx does not decode"),
        ("empty", folder("empty", {"notes.txt": b"hi"}), "holds no PNG or JPEG image"),
        ("not-png", folder("notpng", {"a.png": b"GIF89a...."}), "neither a PNG nor a JPEG"),
    ]
    bad = []
    for name, d, expect in cases:
        cfg = write_config(f"{tmp}/bad-{name}.json",
                           train_data={"type": "image_folder", "folder": d, "resolution": 8})
        p = onyx("batch", cfg, "--output", f"{tmp}/bad-{name}.safetensors", "--count", "1",
                 check=False)
        if p.returncode == 0 or expect not in p.stderr or os.path.exists(f"{tmp}/bad-{name}.safetensors"):
            bad.append(f"{name}: exit {p.returncode}, {p.stderr.strip()[-200:]!r}")
    return not bad, f"{len(cases) - len(bad)}/{len(cases)} refused with the file named" + (
        "; " + "; ".join(bad) if bad else "")


def case_train_from_folder(tmp):
    """train_text_to_image.py's run on a folder: Stable Diffusion's layout in small (a conditional
    UNet, a VAE, a CLIP text encoder and tokenizer; test_diffusion.py's latent_pipeline) trained
    from an image folder with captions logs the same losses, bit for bit, as the same run on the
    batch `onyx batch` wrote of the folder (its pixel_values and input_ids) — the step itself is
    test_diffusion.py's train-latent-text-to-image against the PyTorch loop."""
    import test_diffusion as td
    pipe = td.latent_pipeline(tmp)[0]
    unet = os.path.join(pipe, "unet")
    folder = f"{tmp}/sd-data"
    os.makedirs(f"{folder}/train")
    rng = np.random.default_rng(4)
    words = ["a shirt", "two boots", "a red dress", "a bag", "a coat", "sandals", "a hat", "socks"]
    with open(f"{folder}/train/metadata.jsonl", "w") as f:
        for i in range(16):
            h, w = rng.integers(14, 40, 2)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
                f"{folder}/train/{i}.png")
            f.write(json.dumps({"file_name": f"{i}.png", "text": words[i % 8]}) + "\n")
    spec = {"type": "image_folder", "folder": folder, "resolution": 16, "center_crop": True}
    got = batch(tmp, spec, rows=range(16), name="sd-batch", extra={"model": unet})
    save_file(got, f"{tmp}/sd-batch.safetensors")
    runs = {}
    for name, data in (("folder", spec), ("file", f"{tmp}/sd-batch.safetensors")):
        logs = td.onyx_train(unet, data, f"{tmp}/out-{name}", max_steps=6)
        runs[name] = [e["loss"] for e in logs if "loss" in e]
    ok = len(runs["folder"]) == 6 and runs["folder"] == runs["file"]
    return ok, (f"batch {', '.join(f'{k} {v.shape}' for k, v in sorted(got.items()))}; losses "
                f"from the folder {[round(x, 5) for x in runs['folder']]}, equal to the batch "
                f"file's: {runs['folder'] == runs['file']}")


def main():
    cases = [("pixels", case_pixels), ("random-crop-flip", case_random_crop_flip),
             ("class-folders", case_class_folders), ("captions", case_captions),
             ("bad-input", case_bad_input), ("train-from-folder", case_train_from_folder)]
    return run_cases(cases, "onyx-test-images-")


if __name__ == "__main__":
    sys.exit(main())

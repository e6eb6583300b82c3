"""Keyword spotting in MLPerf Tiny's shape, on real speech made offline: a DS-CNN on MFCCs of ten command words
spoken by Debian's espeak-ng (apt-get install espeak-ng).

The words are Speech Commands' ten (yes no up down left right on off stop go), each spoken by 9 voices (accents)
x 4 voice variants x speeds and pitches, placed at a random offset in a 1 s window with background noise at 10-30 dB
SNR. Features as MLPerf Tiny's KWS: 30 ms frames every 20 ms (49 frames), 40 mel bands, log, DCT, 10 MFCCs:
input "mfcc" [1, 1, 49, 10]. Two voices (accents) are held out entirely: the eval set is speakers the model never
heard.

Writes, next to this file:
  kws_dscnn.pt2    the trained DS-CNN (stem conv 10x4 stride 2, four depthwise-separable blocks of 64, mean, dense)
  kws_calib.npz    160 training windows ("mfcc"), for --calib
  kws_eval.npz     the held-out voices' windows with labels ("mfcc", "label"), for --eval

    python examples/tinyml_fpga/kws.py      # ~1 min on 2 cores
    edgekit convert examples/tinyml_fpga/kws_dscnn.pt2 --target fpga --calib examples/tinyml_fpga/kws_calib.npz \\
        --eval examples/tinyml_fpga/kws_eval.npz
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
VOICES = ["en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd", "en-029", "en-us-nyc",
          "en-gb"]
HELD_OUT = {"en-gb-x-rp", "en-us-nyc"}
VARIANTS = ["", "+f2", "+m3", "+f4"]
SR = 16000
FRAME, HOP, MELS, MFCC = 480, 320, 40, 10


def speak(text: str, voice: str, speed: int, pitch: int, tmp: Path) -> np.ndarray:
    from scipy.signal import resample_poly

    exe = shutil.which("espeak-ng") or shutil.which("espeak")
    if exe is None:
        sys.exit("the keyword-spotting example needs espeak-ng: apt-get install espeak-ng")
    wav = tmp / "w.wav"
    subprocess.run([exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(wav), text], check=True,
                   capture_output=True)
    with wave.open(str(wav)) as wf:
        rate = wf.getframerate()
        x = np.frombuffer(wf.readframes(wf.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    return resample_poly(x, SR, rate).astype(np.float32)


def mel_filters() -> np.ndarray:
    def hz_to_mel(f):
        return 2595 * np.log10(1 + f / 700)

    n_fft = 512
    mels = np.linspace(hz_to_mel(20), hz_to_mel(4000), MELS + 2)
    bins = np.floor((n_fft + 1) * 700 * (10 ** (mels / 2595) - 1) / SR).astype(int)
    fb = np.zeros((MELS, n_fft // 2 + 1), np.float32)
    for i in range(MELS):
        a, b, c = bins[i], bins[i + 1], bins[i + 2]
        fb[i, a:b] = (np.arange(a, b) - a) / max(1, b - a)
        fb[i, b:c] = (c - np.arange(b, c)) / max(1, c - b)
    return fb


def mfcc(x: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """[49, 10] MFCCs of one second of 16 kHz audio."""
    from scipy.fft import dct

    frames = np.stack([x[i:i + FRAME] for i in range(0, SR - FRAME + 1, HOP)])
    spec = np.abs(np.fft.rfft(frames * np.hanning(FRAME), 512)) ** 2
    return dct(np.log(spec @ fb.T + 1e-6), type=2, norm="ortho", axis=1)[:, :MFCC].astype(np.float32)


def dataset(rng: np.random.Generator):
    fb = mel_filters()
    xs, ys, held = [], [], []
    with tempfile.TemporaryDirectory() as t:
        for v in VOICES:
            for var in VARIANTS:
                for w_i, word in enumerate(WORDS):
                    for speed, pitch in ((140, 40), (170, 55), (200, 70)):
                        clip = speak(word, v + var, speed, pitch, Path(t))[: SR * 9 // 10]
                        for _ in range(2):  # two placements and noise draws per utterance
                            win = np.zeros(SR, np.float32)
                            at = rng.integers(0, SR - len(clip) + 1)
                            win[at:at + len(clip)] = clip * rng.uniform(0.3, 1.0)
                            noise = rng.standard_normal(SR).astype(np.float32)
                            snr = rng.uniform(10, 30)
                            win += noise * np.sqrt(np.mean(win**2) / 10 ** (snr / 10))
                            xs.append(mfcc(win, fb))
                            ys.append(w_i)
                            held.append(v in HELD_OUT)
    x = np.stack(xs)[:, None]  # [N, 1, 49, 10]
    return x, np.asarray(ys, np.int64), np.asarray(held)


def main() -> None:
    import torch

    import importlib.util

    sys.path.insert(0, str(HERE))
    from nets import DSCNN

    # train.py's fit, under a name of its own: "train" is also the digits example's module, which train.py imports
    spec = importlib.util.spec_from_file_location("tinyml_train", HERE / "train.py")
    tinyml_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tinyml_train)

    class Named(torch.nn.Module):  # the exported input is "mfcc"
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, mfcc):
            return self.body(mfcc)

    rng = np.random.default_rng(0)
    x, y, held = dataset(rng)
    mu, sd = x[~held].mean(), x[~held].std()
    x = ((x - mu) / sd).astype(np.float32)  # one global normalisation, folded into the data the board gets
    x_tr, y_tr, x_te, y_te = x[~held], y[~held], x[held], y[held]
    net = DSCNN(classes=len(WORDS), width=64, stem=(10, 4), stem_stride=2, pool=None)
    model = Named(tinyml_train.fit(net, x_tr, y_tr, 25)).eval()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean())
    torch.export.save(torch.export.export(model, (torch.zeros(1, 1, 49, 10),)), HERE / "kws_dscnn.pt2")
    pick = rng.choice(len(x_tr), 160, replace=False)
    np.savez_compressed(HERE / "kws_calib.npz", mfcc=x_tr[pick])
    np.savez_compressed(HERE / "kws_eval.npz", mfcc=x_te[::2], label=y_te[::2])  # one placement per utterance
    print(f"kws_dscnn.pt2: {sum(p.numel() for p in model.parameters())} parameters, {len(x_tr)} training windows, "
          f"held-out voices {sorted(HELD_OUT)}: {len(x_te)} windows, accuracy {acc:.2%}")


if __name__ == "__main__":
    main()

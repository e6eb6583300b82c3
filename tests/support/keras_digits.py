"""The Keras digits CNN of the Keras / SavedModel tests and bench/bench_android_keras.py:
conv-BN-ReLU, strided conv, dense; NHWC; trained on scikit-learn's digits (real data, offline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def train_and_save(out: Path, epochs: int = 12) -> dict:
    """Train the CNN (~5 s for 12 epochs) and write ``digits.keras``, the SavedModel ``digits_sm``,
    ``calib.npz`` (200 NHWC training images) and ``eval.npz`` (450 held-out images with labels).
    Returns those paths and the float ``accuracy`` on the held-out images."""
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]  # [N, 8, 8, 1]: Keras is NHWC
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target, test_size=0.25, random_state=0, stratify=d.target)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(16, 3, padding="same"), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_tr, y_tr, epochs=epochs, batch_size=64, verbose=0)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"keras": out / "digits.keras", "saved_model": out / "digits_sm", "calib": out / "calib.npz",
             "eval": out / "eval.npz"}
    model.save(paths["keras"])
    model.export(str(paths["saved_model"]), verbose=False)
    np.savez(paths["calib"], image=x_tr[:200])
    np.savez(paths["eval"], image=x_te, label=y_te)
    acc = float(np.mean(np.argmax(model.predict(x_te, verbose=0), 1) == y_te))
    return {**paths, "accuracy": acc, "params": model.count_params()}

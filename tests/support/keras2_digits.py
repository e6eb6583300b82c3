"""Keras 2 files written by tf-keras itself, for tests/test_keras2.py: run as a script in a child process (so the
test process never has TF_USE_LEGACY_KERAS set). ``python keras2_digits.py OUT`` writes into OUT:

- ``cnn.h5``: Conv2D, DepthwiseConv2D, BatchNorm, ReLU, GlobalAveragePooling, Dense, trained on scikit-learn's
  digits (8x8, NHWC); its DepthwiseConv2D config carries ``groups``, which Keras 3 refuses
- ``cnn_sm``: the same model saved by ``model.save(folder)`` with a Keras 2 (legacy) Adam optimizer that has slots
- ``mlp.h5``: Dense-ReLU-Dense on the flattened digits (64 inputs)
- ``lambda.h5``: a Lambda layer (Python code in the file)
- ``calib.npz`` / ``eval.npz`` (NHWC ``image``) and ``calib_flat.npz`` / ``eval_flat.npz`` (``x``, 64 values)
- ``ref.npz``: tf-keras's own outputs on the first 8 eval images (``cnn``, ``mlp``)
"""

from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf-keras in this process (set before TensorFlow is imported)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    import tf_keras as k
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    assert tf.keras.__name__.startswith("tf_keras"), tf.keras
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target, test_size=0.25, random_state=0, stratify=d.target)
    k.utils.set_random_seed(0)
    cnn = k.Sequential([
        k.Input((8, 8, 1), name="image"),
        k.layers.Conv2D(32, 3, padding="same", activation="relu"),
        k.layers.DepthwiseConv2D(3, strides=2, padding="same"), k.layers.BatchNormalization(), k.layers.ReLU(),
        k.layers.Conv2D(64, 1, activation="relu"),
        k.layers.GlobalAveragePooling2D(), k.layers.Dense(10),
    ])
    cnn.compile(k.optimizers.legacy.Adam(3e-3), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    cnn.fit(x_tr, y_tr, epochs=30, batch_size=64, verbose=0)
    cnn.save(os.path.join(out, "cnn.h5"))
    cnn.save(os.path.join(out, "cnn_sm"))  # a tf.keras SavedModel (keras_metadata.pb), optimizer slots included
    flat_tr, flat_te = x_tr.reshape(-1, 64), x_te.reshape(-1, 64)
    mlp = k.Sequential([k.Input((64,), name="x"), k.layers.Dense(32, activation="relu"), k.layers.Dense(10)])
    mlp.compile(k.optimizers.Adam(1e-2), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    mlp.fit(flat_tr, y_tr, epochs=15, batch_size=64, verbose=0)
    mlp.save(os.path.join(out, "mlp.h5"))
    lam = k.Sequential([k.Input((64,), name="x"), k.layers.Lambda(lambda t: t * 2.0), k.layers.Dense(10)])
    lam.save(os.path.join(out, "lambda.h5"))
    np.savez(os.path.join(out, "calib.npz"), image=x_tr[:200])
    np.savez(os.path.join(out, "eval.npz"), image=x_te, label=y_te)
    np.savez(os.path.join(out, "calib_flat.npz"), x=flat_tr[:200])
    np.savez(os.path.join(out, "eval_flat.npz"), x=flat_te, label=y_te)
    np.savez(os.path.join(out, "ref.npz"), cnn=cnn.predict(x_te[:8], verbose=0), mlp=mlp.predict(flat_te[:8], verbose=0))
    acc = {"cnn": float(np.mean(np.argmax(cnn.predict(x_te, verbose=0), 1) == y_te)),
           "mlp": float(np.mean(np.argmax(mlp.predict(flat_te, verbose=0), 1) == y_te))}
    print("ACCURACY", acc["cnn"], acc["mlp"])


if __name__ == "__main__":
    main(sys.argv[1])

"""TensorFlow honouring its gpushare share: one logical device per GPU with memory_limit = our limit.

    python tensorflow_limit.py

Must run before TensorFlow initialises the GPUs (before the first op): after that the
configuration can no longer change.
"""

from __future__ import annotations

import sys

from gpushare_limits import load_or_exit


def main() -> int:
    share = load_or_exit("tensorflow")
    limit_mib = share.limit_mib - share.reserve_mib
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print("tensorflow: no GPU visible (tensorflow[and-cuda] installed? NVIDIA runtime set up?)", file=sys.stderr)
        return 2
    for gpu in gpus:
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)])
        print(f"tensorflow: {gpu.name} limited to {limit_mib} MiB")
    with tf.device("/GPU:0"):
        x = tf.ones((1024, 1024))
        print(f"tensorflow: computed {float(tf.reduce_sum(x @ x)):.0f} within the share")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode + augment throughput, batchcast vs torchvision, on the same files in one run.

Both sides: one thread, decode + RandomResizedCrop(224) + RandomHorizontalFlip + normalise to
float32 CHW. torchvision: PIL open + Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
ToTensor(), Normalize()]). batchcast: ImagePipeline.process_into() into a preallocated batch
(as the server writes into a shared-memory slot). Measured in CPU-seconds of this process
(resource.getrusage), so other load on the machine does not skew it.

  .venv/bin/python bench/decode_vs_torchvision.py [--images 200] [--seconds 5]
"""
import argparse
import resource
import shutil
import tempfile

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

import batchcast._batchcast as bc


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(run_epoch, n_images, min_seconds):
    run_epoch(0)  # warm-up: page cache, allocators, thread_local buffers
    done, epoch, start = 0, 1, cpu_seconds()
    while cpu_seconds() - start < min_seconds:
        run_epoch(epoch)
        done += n_images
        epoch += 1
    return done / (cpu_seconds() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0, help="min CPU-s per side")
    parser.add_argument("--dir", help="existing ImageFolder (default: make one in a temp dir)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # single thread for both sides
    tmp = None
    root = args.dir
    if root is None:
        tmp = tempfile.mkdtemp(prefix="bc_vs_tv_")
        root = tmp
        report = bc.make_dataset(root, classes=10, images_per_class=(args.images + 9) // 10)
        print(f"made {report['images']} images ({report['bytes'] / 1e6:.1f} MB) "
              f"from {report['sources']} photos")
    try:
        paths = [p for p, _ in bc.Dataset.image_folder(root).entries]
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize(mean, std)])

        def torchvision_epoch(epoch):
            for p in paths:
                with open(p, "rb") as f:
                    img = Image.open(f).convert("RGB")
                tf(img)

        pipeline = bc.ImagePipeline(
            bc.PipelineOptions(image_size=224, train=True, output="float32"))
        batch = np.empty((len(paths), 3, 224, 224), np.float32)

        def batchcast_epoch(epoch):
            for i, p in enumerate(paths):
                pipeline.process_into(p, epoch, i, batch[i])

        tv = measure(torchvision_epoch, len(paths), args.seconds)
        ours = measure(batchcast_epoch, len(paths), args.seconds)
        print(f"torchvision (PIL + transforms): {tv:8.1f} images/CPU-s")
        print(f"batchcast (ImagePipeline):      {ours:8.1f} images/CPU-s")
        print(f"ratio batchcast / torchvision:  {ours / tv:8.2f}x")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

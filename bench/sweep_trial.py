"""One trial of the sweep figure (bench/RESULTS.md, "A sweep with batchcast sweep"): an ordinary
torchvision training script, with a plain torch DataLoader, that nothing here was written for.
`batchcast sweep --share-dataloaders` runs it unchanged on the sweep's shared stream; without
that flag each trial decodes its own copy.

    python bench/sweep_trial.py --data DIR --model resnet18 --size 224 --lr 0.1 --epochs 2
"""

import argparse
import time

import torch
import torchvision
import torchvision.transforms as T


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="an ImageFolder")
    p.add_argument("--model", default="resnet18", help="a torchvision.models name")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()

    transform = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dataset = torchvision.datasets.ImageFolder(args.data, transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, pin_memory=True,
                                         drop_last=True)
    model = getattr(torchvision.models, args.model)(num_classes=len(dataset.classes)).cuda()
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    start, samples, loss = time.monotonic(), 0, torch.zeros(())
    for epoch in range(args.epochs):
        for images, labels in loader:
            images = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
            labels = labels.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            samples += len(labels)
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    seconds = time.monotonic() - start
    print(f"{args.model} {args.size} px lr {args.lr}: {samples} samples in {seconds:.1f} s "
          f"({samples / seconds:.0f} samples/s)", flush=True)
    print(f"batchcast-objective: {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()

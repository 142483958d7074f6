"""``yolo-bimamba`` console script: Ultralytics' ``yolo`` CLI with the yolo-bimamba blocks registered.

    yolo-bimamba train model=yolov8n-bimamba.yaml data=digits.yaml epochs=10 imgsz=160
    yolo-bimamba val|predict|export ...            (anything the stock `yolo` command accepts)
    yolo-bimamba swap-hydra IN.pt OUT.pt [--target hydra|bimamba2]
    yolo-bimamba build-data [key=value ...]        (build the default digits dataset, print its data YAML)

Offline by default: unless YOLO_OFFLINE is set (YOLO_OFFLINE=0 to go online), this command sets it to true.
"""

from __future__ import annotations

import sys

USAGE = __doc__


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "swap-hydra":
        from .swap import cli_main

        return cli_main(argv[1:])
    if argv and argv[0] == "build-data":
        from .data import build_digits_dataset

        kv = dict(a.split("=", 1) for a in argv[1:])
        print(build_digits_dataset(**{k: v if k == "name" else float(v) for k, v in kv.items()}))
        return 0
    if argv and argv[0] in {"-h", "--help"}:
        print(USAGE)

    from . import ultralytics_glue

    ultralytics_glue.default_offline()
    ultralytics_glue.register()
    from ultralytics.cfg import entrypoint

    # entrypoint() reads ultralytics.utils.ARGV, which is the very sys.argv list object: update it in place.
    prog = sys.argv[0] if sys.argv else "yolo-bimamba"
    sys.argv[:] = [prog, *argv]
    return entrypoint()


if __name__ == "__main__":
    sys.exit(main())

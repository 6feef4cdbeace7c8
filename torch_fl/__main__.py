"""python -m torch_fl: information about the installation."""

import sys


def main(argv=None) -> int:
    import torch

    import torch_fl

    print(f"torch_fl {torch_fl.__version__}, torch {torch.__version__}")
    print(f"driver: {torch_fl.driver()}  devices: {torch.flagos.device_count()}")
    print(f"FlagGems enabled: {torch_fl.is_flaggems_enabled()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

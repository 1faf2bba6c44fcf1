# python -m ddprun [ddprun arguments]: the same as the ddprun command (os.execv of the binary).
from ddprun import main

if __name__ == "__main__":
    main()

"""The benchmark suite of docs/CONTRACT.md, for the scripts in bench/.

name: (B, N, L, H, D, mask_bias, pair_bias), with Lq = Lk = L, in the contract's order."""

SUITE = {
    "tri256": (1, 256, 256, 4, 32, True, True),
    "tri768": (1, 768, 768, 4, 32, True, True),
    "msarow": (1, 512, 256, 8, 32, True, True),
    "msacol": (1, 256, 512, 8, 32, True, False),
    "extramsa": (1, 5120, 384, 8, 8, True, True),
    "template": (4, 256, 256, 4, 16, True, True),
    "apb768": (1, 1, 768, 16, 24, False, True),
    "tri256d64": (1, 256, 256, 8, 64, True, True),
    "b4tri384": (4, 384, 384, 4, 32, True, True),
}

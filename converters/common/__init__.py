"""What two converters share, below them (no converter is imported here): the PT2E quantization steps of
torch input (:mod:`.pt2e`: the program to quantize, its observer choice and calibration, the mixed search's
outputs) and the fx recording interpreter that ranks the layers of a fake-quant program (:mod:`.fxrecord`).
torch and torchao are imported inside the functions that use them."""

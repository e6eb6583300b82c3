from edgekit._vendor.onnx2torch.converter import convert

package native

// Tensor is a dense row-major tensor: Data holds the product of Shape values of DType,
// little-endian, the last dimension contiguous. Whoever makes one owns Data; the kernels keep
// no Tensor.
type Tensor struct {
	DType DType
	Shape []int
	Data  []byte
}

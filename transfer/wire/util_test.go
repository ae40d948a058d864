package wire

import (
	"os"
	"unsafe"
)

var errDeadline = os.ErrDeadlineExceeded

func unsafePointer(p []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(p)) }

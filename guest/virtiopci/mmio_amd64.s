#include "textflag.h"

// Plain loads and stores of one width: MMIO accessors.

// func mmioRead8(p *uint8) uint8
TEXT ·mmioRead8(SB), NOSPLIT, $0-9
	MOVQ p+0(FP), AX
	MOVB (AX), BX
	MOVB BX, ret+8(FP)
	RET

// func mmioRead16(p *uint16) uint16
TEXT ·mmioRead16(SB), NOSPLIT, $0-10
	MOVQ p+0(FP), AX
	MOVW (AX), BX
	MOVW BX, ret+8(FP)
	RET

// func mmioRead32(p *uint32) uint32
TEXT ·mmioRead32(SB), NOSPLIT, $0-12
	MOVQ p+0(FP), AX
	MOVL (AX), BX
	MOVL BX, ret+8(FP)
	RET

// func mmioWrite8(p *uint8, v uint8)
TEXT ·mmioWrite8(SB), NOSPLIT, $0-9
	MOVQ p+0(FP), AX
	MOVB v+8(FP), BX
	MOVB BX, (AX)
	RET

// func mmioWrite16(p *uint16, v uint16)
TEXT ·mmioWrite16(SB), NOSPLIT, $0-10
	MOVQ p+0(FP), AX
	MOVW v+8(FP), BX
	MOVW BX, (AX)
	RET

// func mmioWrite32(p *uint32, v uint32)
TEXT ·mmioWrite32(SB), NOSPLIT, $0-12
	MOVQ p+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, (AX)
	RET

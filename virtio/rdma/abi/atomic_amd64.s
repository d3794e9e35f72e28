#include "textflag.h"

// func load16(addr *uint16) uint16
TEXT ·load16(SB), NOSPLIT, $0-10
	MOVQ	addr+0(FP), AX
	MOVW	(AX), BX
	MOVW	BX, ret+8(FP)
	RET

// func store16(addr *uint16, v uint16)
// XCHG with a memory operand is locked: a full barrier, as a sequentially
// consistent store must be.
TEXT ·store16(SB), NOSPLIT, $0-10
	MOVQ	addr+0(FP), AX
	MOVW	v+8(FP), BX
	XCHGW	BX, (AX)
	RET

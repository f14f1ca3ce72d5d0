// The precompiled header of dist_tests and apps_dist_tests (tests/meson.build): unit_pch.h and
// weft.h, which every multi-rank suite includes. Each file still includes what it uses.
#include "unit_pch.h"
#include "weft.h"

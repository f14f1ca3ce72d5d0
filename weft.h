#pragma once
#include "core/tensor.h"

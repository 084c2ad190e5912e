// kvcore version: the single source of truth (pyproject reads it from here).
#pragma once

#define KVCORE_VERSION_MAJOR 0
#define KVCORE_VERSION_MINOR 1
#define KVCORE_VERSION_PATCH 0
#define KVCORE_VERSION "0.1.0"

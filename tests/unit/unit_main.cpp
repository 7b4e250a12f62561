// tests/unit/unit_main.cpp — Catch2's main for the single-process unit tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

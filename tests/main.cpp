/**
 * @file main.cpp
 * @brief doctest entry point of the test binaries.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

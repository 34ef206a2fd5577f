// A table of kernel instantiations by a count known only at run time (rows per pass, say): the
// kernel files pick kernel<R> for R = 1..N from it. Include only from kernel sources.
#pragma once

#include <array>
#include <utility>

namespace specdec {

// {make.operator()<1>(), .., make.operator()<N>()}: `make` is a lambda template returning the
// function pointer of one instantiation, e.g.
//   static constexpr auto kByRows =
//       kernel_table<6>([]<int R>() { return &accumulate_rows<R, kMerge, V>; });
//   kByRows[rows - 1](...);
template <int N, class Make>
constexpr auto kernel_table(Make make) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    return std::array{make.template operator()<I + 1>()...};
  }
  (std::make_integer_sequence<int, N>{});
}

}  // namespace specdec

# fish completion for traceflow (candidates from `traceflow __complete`)
function __traceflow_complete
    set -l words (commandline -opc) (commandline -ct)
    set -l out ($words[1] __complete $words[2..-1] 2>/dev/null)
    if test "$out[1]" = ":files"
        __fish_complete_path (commandline -ct)
    else
        printf '%s\n' $out
    end
end
complete -c traceflow -f -a '(__traceflow_complete)'
complete -c kubectl-traceflow -f -a '(__traceflow_complete)'
